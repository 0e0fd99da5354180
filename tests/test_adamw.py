"""forge_jax.adamw as an optax transform, against optax.adamw."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import rel_err
import forge_jax as fj
from forge_jax.rules import ADAMW


def _tree(rng):
  return {"w": jnp.asarray(rng.standard_normal((7, 5)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal((5,)), jnp.float32),
          "s": jnp.asarray(rng.standard_normal(()), jnp.float32)}


@pytest.mark.parametrize("lr", [3e-2, optax.linear_schedule(3e-2, 1e-3, 4)])
def test_matches_optax_adamw_for_5_steps(rng, lr):
  params = _tree(rng)
  kw = dict(b1=0.8, b2=0.95, eps=1e-6, weight_decay=0.05)
  ours, ref = fj.adamw(lr, **kw), optax.adamw(lr, **kw)
  p1, p2 = params, params
  s1, s2 = ours.init(p1), ref.init(p2)
  for _ in range(5):
    g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    u1, s1 = jax.jit(ours.update)(g, s1, p1)
    u2, s2 = jax.jit(ref.update)(g, s2, p2)
    p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
  for k in params:
    assert rel_err(p1[k], p2[k]) < 1e-6, k


def test_state_names_follow_optax():
  state = fj.scale_by_adamw().init({"w": jnp.ones((2, 3))})
  assert isinstance(state, fj.ScaleByAdamWState)
  assert state.count.dtype == jnp.int32 and state.count.shape == ()
  assert state.mu["w"].dtype == jnp.float32 and state.nu["w"].shape == (2, 3)


def test_is_an_optax_transformation_usable_in_chains(rng):
  params = _tree(rng)
  tx = optax.chain(optax.clip_by_global_norm(1.0), fj.adamw(1e-2))
  assert isinstance(fj.adamw(1e-2), optax.GradientTransformationExtraArgs)
  state = tx.init(params)
  g = jax.tree.map(lambda p: 10 * jnp.ones_like(p), params)
  updates, state = tx.update(g, state, params)
  assert jax.tree.structure(updates) == jax.tree.structure(params)
  # Clipping acts before AdamW: the first step is -lr * sign(g) either way, so
  # check the clipped moments instead (mu = (1 - b1) * clipped g).
  norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g)))
  mu = state[1][0].mu
  for k in params:
    np.testing.assert_allclose(mu[k], 0.1 * g[k] / norm, rtol=1e-6)


def test_fused_description_is_carried():
  sched = optax.cosine_decay_schedule(1e-3, 10)
  tx = fj.adamw(sched, b1=0.85, weight_decay=0.2)
  assert tx.rule is ADAMW
  hp = tx.hyperparams_at(jnp.asarray(3))
  assert np.isclose(hp["learning_rate"], sched(3)) and np.isclose(hp["b1"], 0.85)
  packed = tx.packed_hyperparams(jnp.asarray(3))
  assert packed.dtype == jnp.float32 and packed.shape == (ADAMW.num_hyperparams,)
  assert float(packed[-1]) == 4.0  # bias-correction count after the update


def test_update_needs_params_only_for_weight_decay():
  tx = fj.scale_by_adamw()  # weight_decay=1e-4 by default
  state = tx.init({"w": jnp.ones(3)})
  with pytest.raises(ValueError, match="needs params"):
    tx.update({"w": jnp.ones(3)}, state)
  # Without weight decay, as in optax, params are optional.
  for tx in (fj.sgd(0.1), fj.adamw(0.1, weight_decay=0.0)):
    p = {"w": jnp.ones(3)}
    u1, _ = tx.update({"w": jnp.full(3, 2.0)}, tx.init(p))
    u2, _ = tx.update({"w": jnp.full(3, 2.0)}, tx.init(p), p)
    np.testing.assert_array_equal(u1["w"], u2["w"])


@pytest.mark.parametrize("kw,match", [
    ({"learning_rate": "fast"}, "'learning_rate' must be a real scalar"),
    ({"learning_rate": jnp.ones(3)}, "'learning_rate' must be a scalar"),
    ({"learning_rate": 1j}, "'learning_rate' must be real"),
    ({"learning_rate": 1e-3, "b1": None}, "'b1' must be a real scalar"),
    ({"learning_rate": 1e-3, "b1": 1.0}, "b1=1.0 must be in"),
    ({"learning_rate": 1e-3, "b2": -0.1}, "b2=-0.1 must be in"),
    ({"learning_rate": 1e-3, "eps": -1e-8}, r"eps=-1e-08 must be in \[0.0, inf\)"),
    ({"learning_rate": 1e-3, "weight_decay": -1.0}, "weight_decay=-1.0"),
    ({"learning_rate": 1e-3, "b1": optax.constant_schedule(0.9)},
     "b1 must be a number, not a schedule"),
])
def test_bad_hyperparameters_are_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    fj.adamw(**kw)


def test_default_hyperparameters_match_optax_to_the_ulp(rng):
  """b2=0.999: (1 - b2) is taken in double precision, as optax does."""
  params = _tree(rng)
  ours, ref = fj.adamw(1e-3), optax.adamw(1e-3)
  s1, s2 = ours.init(params), ref.init(params)
  for _ in range(3):
    g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    u1, s1 = ours.update(g, s1, params)
    u2, s2 = ref.update(g, s2, params)
  for k in params:
    assert rel_err(s1[0].nu[k], s2[0].nu[k]) < 1e-6, k
    assert rel_err(u1[k], u2[k]) < 1e-6, k


def test_pack_refuses_missing_or_non_scalar():
  with pytest.raises(ValueError, match="missing"):
    ADAMW.pack({"learning_rate": 1.0}, 1)
  with pytest.raises(ValueError, match="'b1' must be a scalar"):
    ADAMW.pack(dict(learning_rate=1.0, b1=jnp.ones(2), b2=0.9, eps=1e-8,
                    weight_decay=0.0), 1)
