"""Low-precision and edge-case behaviour of every optax transform."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import forge_jax as fj

# Every optimizer with weight decay off (so that zero gradients mean zero updates).
FACTORIES = {
    "adamw": lambda lr, **kw: fj.adamw(lr, weight_decay=0.0, **kw),
    "nadamw": lambda lr, **kw: fj.nadamw(lr, weight_decay=0.0, **kw),
    "radam": lambda lr, **kw: fj.radam(lr, **kw),
    "lion": lambda lr, **kw: fj.lion(lr, weight_decay=0.0, **kw),
    "rmsprop": lambda lr, **kw: fj.rmsprop(lr, **kw),
    "adagrad": lambda lr, **kw: fj.adagrad(lr, **kw),
    "sgd": lambda lr, **kw: fj.sgd(lr, **kw),
    "sgd_momentum": lambda lr, **kw: fj.sgd(lr, momentum=0.9, **kw),
    "sgd_nesterov": lambda lr, **kw: fj.sgd(lr, momentum=0.9, nesterov=True, **kw),
}
EPS = {"adamw": {"eps": 1e-8}, "nadamw": {"eps": 1e-8}, "radam": {"eps": 1e-8},
       "rmsprop": {"eps": 1e-8}, "adagrad": {"eps": 1e-8}}


# The state-dtype arguments of each optimizer (optax's names where it has them).
STATE_DTYPE_ARGS = {
    "adamw": ("mu_dtype", "nu_dtype"), "nadamw": ("mu_dtype", "nu_dtype"),
    "radam": ("mu_dtype", "nu_dtype"), "lion": ("mu_dtype",),
    "rmsprop": ("nu_dtype",), "adagrad": ("sum_of_squares_dtype",), "sgd": (),
    "sgd_momentum": ("accumulator_dtype",), "sgd_nesterov": ("accumulator_dtype",),
}


@pytest.mark.parametrize("state_dtype", [jnp.float32, jnp.bfloat16, jnp.int8])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_zero_gradients_change_nothing(rng, name, dtype, state_dtype):
  params = {"w": jnp.asarray(rng.standard_normal((4, 16)), dtype)}
  kw = {arg: state_dtype for arg in STATE_DTYPE_ARGS[name]}
  tx = FACTORIES[name](1e-2, **EPS.get(name, {}), **kw)
  state = tx.init(params)
  if kw:  # the state is stored as asked: int8 codes, or arrays of the dtype
    want = jnp.int8 if state_dtype == jnp.int8 else state_dtype
    assert jnp.dtype(want) in {x.dtype for x in jax.tree.leaves(state)}
  p = params
  for _ in range(3):
    updates, state = jax.jit(tx.update)({"w": jnp.zeros((4, 16), dtype)}, state, p)
    assert updates["w"].dtype == dtype
    np.testing.assert_array_equal(np.asarray(updates["w"], np.float32), 0.0)
    p = optax.apply_updates(p, updates)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))
  np.testing.assert_array_equal(np.asarray(p["w"], np.float32),
                                np.asarray(params["w"], np.float32))


@pytest.mark.parametrize("lr", [1e-3, jnp.bfloat16(1e-3), np.asarray(1e-3, jnp.bfloat16)],
                         ids=["python", "jnp_bf16", "numpy_bf16"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_update_keeps_the_param_dtype(rng, name, lr):
  params = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.bfloat16)}
  tx = FACTORIES[name](lr)
  g = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.bfloat16)}
  updates, _ = tx.update(g, tx.init(params), params)
  assert updates["w"].dtype == jnp.bfloat16
  assert optax.apply_updates(params, updates)["w"].dtype == jnp.bfloat16


# First step over lr * sign(g): Adam's is 1; NAdam's look-ahead adds b1 / (1 + b1).
@pytest.mark.parametrize("name,factor", [("adamw", 1.0), ("nadamw", 1 + 0.9 / 1.9)])
def test_huge_gradient_first_step_is_about_lr_times_sign(name, factor):
  params = {"w": jnp.ones((4, 16), jnp.bfloat16)}
  g = jnp.full((4, 16), 1e20, jnp.bfloat16) * jnp.where(jnp.arange(16) % 2, 1, -1)
  tx = FACTORIES[name](1e-3)
  updates, state = tx.update({"w": g}, tx.init(params), params)
  u = np.asarray(updates["w"], np.float32)
  assert np.all(np.isfinite(u)) and all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state))
  np.testing.assert_allclose(u, -1e-3 * factor * np.sign(np.asarray(g, np.float32)),
                             rtol=2e-2)


INJECTED = {
    "adamw": (fj.adamw, {"b2": 0.999, "weight_decay": 0.0}),
    "nadamw": (fj.nadamw, {"b2": 0.999, "weight_decay": 0.0}),
    "radam": (fj.radam, {"b2": 0.999}),
    "lion": (fj.lion, {"b2": 0.999}),
    "rmsprop": (fj.rmsprop, {"decay": 0.999}),
    "adagrad": (fj.adagrad, {"eps": 1e-7}),
    "sgd": (fj.sgd, {"weight_decay": 0.0}),
    "sgd_momentum": (fj.sgd, {"momentum": 0.999}),
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_inject_hyperparams_keeps_them_fp32(rng, name):
  params = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.bfloat16)}
  factory, kw = INJECTED[name]
  tx = optax.inject_hyperparams(factory, hyperparam_dtype=jnp.float32)(
      learning_rate=1e-3, **kw)
  state = tx.init(params)
  g = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.bfloat16)}
  updates, state = jax.jit(tx.update)(g, state, params)
  assert updates["w"].dtype == jnp.bfloat16
  for k, v in kw.items():
    assert state.hyperparams[k].dtype == jnp.float32
    assert float(state.hyperparams[k]) == np.float32(v)  # 0.999 is not 1.0
  assert bool(jnp.all(jnp.isfinite(updates["w"].astype(jnp.float32))))


def test_inject_hyperparams_rounding_b2_to_one_is_refused():
  """optax casts float hyperparameters to the params' dtype unless told
  otherwise; b2 = 0.999 in bf16 is 1.0, which the rule refuses."""
  params = {"w": jnp.ones((4, 16), jnp.bfloat16)}
  tx = optax.inject_hyperparams(fj.adamw)(learning_rate=1e-3, b2=0.999)
  with pytest.raises(ValueError, match="b2=1.0 must be in"):
    tx.init(params)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_donated_step_equals_undonated(rng, name):
  params = {"w": jnp.asarray(rng.standard_normal((4, 16)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal((16,)), jnp.float32)}
  tx = FACTORIES[name](1e-2)
  state = tx.init(params)
  params_ids = {id(x) for x in jax.tree.leaves(params)}
  assert not params_ids & {id(x) for x in jax.tree.leaves(state)}

  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  g = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)
  want = jax.jit(step)(params, state, g)
  got = jax.jit(step, donate_argnums=(0, 1))(jax.tree.map(jnp.copy, params),
                                              jax.tree.map(jnp.copy, state), g)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
