"""Every fused optimizer: its optax transform against optax's own, and the
fused ForgeDense step against the same transform applied unfused.

Hyperparameter mapping to optax (names and defaults are optax's):
  adamw    -> optax.adamw(lr, b1, b2, eps, weight_decay)
  nadamw   -> optax.nadamw(lr, b1, b2, eps, weight_decay)
  radam    -> optax.radam(lr, b1, b2, eps, threshold)        (weight_decay=0)
  lion     -> optax.lion(lr, b1, b2, weight_decay)
  rmsprop  -> optax.rmsprop(lr, decay, eps)                   (weight_decay=0)
  adagrad  -> optax.adagrad(lr, initial_accumulator_value, eps) (weight_decay=0)
  sgd      -> optax.sgd(lr, momentum=None / momentum, nesterov)  (weight_decay=0)
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import fused_and_unfused, lower_for_cuda
from conftest import rel_err
import forge_jax as fj
from forge_jax.rules import ALL_RULES
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference

LR = optax.linear_schedule(3e-2, 3e-3, 8)
STEPS = 8  # RAdam with b2=0.9 rectifies from step 6 on

# name -> (ours, optax's built-in equivalent or None)
OPTIMIZERS = {
    "adamw": (lambda: fj.adamw(LR, b1=0.8, b2=0.95, weight_decay=0.1),
              lambda: optax.adamw(LR, b1=0.8, b2=0.95, weight_decay=0.1)),
    "adamw_defaults": (lambda: fj.adamw(LR), lambda: optax.adamw(LR)),
    "nadamw": (lambda: fj.nadamw(LR, b2=0.99, weight_decay=0.1),
               lambda: optax.nadamw(LR, b2=0.99, weight_decay=0.1)),
    "radam": (lambda: fj.radam(LR, b2=0.9), lambda: optax.radam(LR, b2=0.9)),
    "lion": (lambda: fj.lion(LR, weight_decay=0.01),
             lambda: optax.lion(LR, weight_decay=0.01)),
    "rmsprop": (lambda: fj.rmsprop(LR, decay=0.8), lambda: optax.rmsprop(LR, decay=0.8)),
    "adagrad": (lambda: fj.adagrad(LR), lambda: optax.adagrad(LR)),
    "sgd": (lambda: fj.sgd(LR), lambda: optax.sgd(LR)),
    "sgd_momentum": (lambda: fj.sgd(LR, momentum=0.9), lambda: optax.sgd(LR, momentum=0.9)),
    "sgd_nesterov": (lambda: fj.sgd(LR, momentum=0.9, nesterov=True),
                     lambda: optax.sgd(LR, momentum=0.9, nesterov=True)),
    "sgd_weight_decay": (lambda: fj.sgd(LR, weight_decay=0.1),
                         lambda: optax.chain(optax.add_decayed_weights(0.1), optax.sgd(LR))),
}


def test_every_rule_has_an_optimizer():
  assert {fj_tx().rule.name for fj_tx, _ in OPTIMIZERS.values()} == {
      r.name for r in ALL_RULES}


@pytest.mark.parametrize("name, instead", [
    ("adam", "adamw(learning_rate, weight_decay=0.0)"),
    ("momentum", "sgd(learning_rate, momentum=0.9)")])
def test_an_optax_name_without_a_fused_twin_says_what_to_use(name, instead):
  with pytest.raises(AttributeError, match=re.escape(instead)):
    getattr(fj, name)
  with pytest.raises(AttributeError, match="no attribute 'no_such_name'$"):
    fj.no_such_name  # pylint: disable=pointless-statement
  # Every optimizer the message lists exists.
  assert all(callable(getattr(fj, n)) for n in fj._OPTIMIZERS)  # pylint: disable=protected-access
  assert not hasattr(fj, "adam")


def _tree(rng):
  return {"w": jnp.asarray(rng.standard_normal((7, 5)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal((5,)), jnp.float32)}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_matches_optax_builtin(rng, name):
  ours_fn, ref_fn = OPTIMIZERS[name]
  params = _tree(rng)
  ours, ref = ours_fn(), ref_fn()
  p1, p2, s1, s2 = params, params, ours.init(params), ref.init(params)
  for _ in range(STEPS):
    g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
    u1, s1 = jax.jit(ours.update)(g, s1, p1)
    u2, s2 = jax.jit(ref.update)(g, s2, p2)
    p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
  for k in params:
    assert rel_err(p1[k], p2[k]) < 1e-5, k


@pytest.mark.parametrize("implementation,interpret", [("xla", False), ("triton", True)])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_matches_the_same_transform_unfused(rng, name, implementation, interpret):
  ours_fn, _ = OPTIMIZERS[name]
  state, params, _, sizes = fused_and_unfused(
      rng, ours_fn, implementation=implementation, interpret=interpret)
  for layer in ("fc1", "fc2"):
    for leaf in ("kernel", "bias"):
      assert rel_err(state.params[layer][leaf], params[layer][leaf]) <= 1e-5, (layer, leaf)
  assert sizes[-1] == 1  # a schedule of the step count does not recompile


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.name)
def test_kernel_matches_reference_for_every_rule(rng, rule):
  t, d_in, d_out = 45, 37, 21
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  state = tuple(jnp.asarray(0.1 * rng.random((d_in, d_out)), jnp.float32)
                for _ in rule.state_names)
  raw = {"learning_rate": 0.01, "b1": 0.9, "b2": 0.9, "eps": 1e-8, "threshold": 5.0,
         "weight_decay": 0.05, "decay": 0.9, "momentum": 0.9}
  hp = rule.pack({n: raw[n] for n in rule.hyperparam_names}, 7)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=rule)
  cfg = FusedDWConfig(16, 16, 16, 2, 4, 1)
  got = fused_dw_update(x, dy, w, state, hp, rule=rule, implementation="triton",
                        interpret=True, config=cfg)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    assert bool(jnp.all(jnp.isfinite(a)))
    assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.name)
def test_every_rule_lowers_to_triton(rule):
  from pallas_kernels.fused_dw import kernel_triton
  n = len(rule.state_names)

  def f(x, dy, w, *rest):
    *state, hp = rest
    return kernel_triton.fused_dw_update_triton(
        x, dy, w, tuple(state), hp, rule=rule,
        config=FusedDWConfig.default(64, 64, 64, jnp.bfloat16), interpret=False)

  sds = jax.ShapeDtypeStruct
  args = [sds((64, 64), jnp.bfloat16)] * 2 + [sds((64, 64), jnp.float32)] * (1 + n)
  args.append(sds((rule.num_hyperparams,), jnp.float32))
  text = lower_for_cuda(jax.jit(f), *args).as_text()
  assert "__gpu$xla.gpu.triton" in text


def test_adagrad_state_starts_at_its_initial_value(rng):
  m = fj.ForgeDense(3, optimizer=fj.adagrad(0.1, initial_accumulator_value=0.25))
  v = m.init(jax.random.key(0), jnp.ones((2, 4)))
  np.testing.assert_array_equal(v["forge_state"]["sum_of_squares"], np.full((4, 3), 0.25))


@pytest.mark.parametrize("make,match", [
    (lambda: fj.sgd(0.1, nesterov=True), "nesterov=True needs a momentum"),
    (lambda: fj.sgd(0.1, momentum=1.5), "momentum=1.5 must be in"),
    (lambda: fj.rmsprop(0.1, decay=1.0), "decay=1.0 must be in"),
    (lambda: fj.adagrad(0.1, initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (lambda: fj.lion(0.1, b2=2.0), "b2=2.0 must be in"),
    (lambda: fj.radam(0.1, threshold=None), "'threshold' must be a real scalar"),
    (lambda: fj.adamw("3e-4"), "'learning_rate' must be a real scalar, got str"),
    (lambda: fj.adamw(-1e-3), "learning_rate=-0.001 must be >= 0 and finite"),
    (lambda: fj.lion(float("nan")), "learning_rate=nan must be >= 0"),
    (lambda: fj.sgd(float("inf")), "learning_rate=inf must be >= 0 and finite"),
    (lambda: fj.adamw(1e39), "learning_rate=1e.39 must be >= 0 and finite in float32"),
    (lambda: fj.fold_adam(-1e-3), "learning_rate=-0.001 must be >= 0"),
    (lambda: fj.fold_adam("3e-4"), "'learning_rate' must be a real scalar, got str"),
])
def test_bad_hyperparameters_are_refused(make, match):
  with pytest.raises(ValueError, match=match):
    make()


@pytest.mark.parametrize("count", [0, -1, np.float32(0.0), jnp.int32(0),
                                   float("nan"), np.array([0.0])])
def test_pack_refuses_a_count_below_one(count):
  # count is 1-based (optax's count after its increment); 0 would divide
  # by zero in the bias corrections and give NaN without an error.
  from forge_jax.rules import ADAMW as rule  # pylint: disable=g-import-not-at-top
  hp = dict(learning_rate=1e-3, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1)
  with pytest.raises(ValueError, match="count=.*1-based"):
    rule.pack(hp, count)
  assert float(rule.pack(hp, 1)[-1]) == 1.0
  assert float(jax.jit(lambda c: rule.pack(hp, c))(0)[-1]) == 0.0  # traced: not checked
