"""FOAM inside FORGE: fold_adam's folded moments updated in the fused epilogue."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import ON_GPU
from conftest import fused_and_unfused
from conftest import rel_err
from conftest import triton_text_with_int8_state
import forge_jax as fj
from forge_jax._src.fold import FoldAdamRule
from pallas_kernels import quantization as q
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference

IMPLEMENTATIONS = [("xla", False), ("triton", True)] + (
    [("triton", False)] if ON_GPU else [])
LR = optax.linear_schedule(3e-2, 3e-3, 8)


def _fused_and_unfused(rng, make, implementation, interpret, widths=(70, 7)):
  state, params, opt_state, _ = fused_and_unfused(
      rng, make, implementation=implementation, interpret=interpret, widths=widths)
  return state, params, opt_state


@pytest.mark.parametrize("implementation,interpret", IMPLEMENTATIONS)
@pytest.mark.parametrize("fold_level", [0, 2, 3, 4])
def test_fused_fold_adam_equals_the_optax_transform(rng, fold_level, implementation,
                                                    interpret):
  """fc1 is 13 -> 70 (70 not a multiple of 2**l), fc2 70 -> 7 (narrower than a block)."""
  make = lambda: fj.fold_adam(LR, fold_level=fold_level, weight_decay=0.1,  # noqa: E731
                              scale=0.5)
  state, params, opt_state = _fused_and_unfused(rng, make, implementation, interpret)
  for layer in ("fc1", "fc2"):
    for leaf in ("kernel", "bias"):
      assert rel_err(state.params[layer][leaf], params[layer][leaf]) <= 1e-5, (layer, leaf)
  # The fused layer's folded moments are those of the optax transform.
  fs = state.forge_state["fc1"]
  assert fs["mu"].shape == (13, -(-70 // 2**fold_level))
  ref = opt_state[0]
  assert rel_err(fs["mu"], ref.mu["fc1"]["kernel"]) <= 1e-5
  assert rel_err(fs["nu"], ref.nu["fc1"]["kernel"]) <= 1e-5


@pytest.mark.parametrize("implementation,interpret", IMPLEMENTATIONS)
@pytest.mark.parametrize("nu_mode,residual", [("square_of_mean", True),
                                              ("mean_of_squares", False)])
def test_fused_fold_adam_variants(rng, nu_mode, residual, implementation, interpret):
  make = lambda: fj.fold_adam(LR, fold_level=3, nu_mode=nu_mode,  # noqa: E731
                              residual=residual)
  state, params, _ = _fused_and_unfused(rng, make, implementation, interpret)
  for layer in ("fc1", "fc2"):
    assert rel_err(state.params[layer]["kernel"], params[layer]["kernel"]) <= 1e-5


@pytest.mark.parametrize("implementation,interpret", IMPLEMENTATIONS)
@pytest.mark.parametrize("fold_level", [2, 3])
def test_fused_fold_adam_with_int8_folded_moments(rng, fold_level, implementation,
                                                  interpret):
  make = lambda: fj.fold_adam(LR, fold_level=fold_level, mu_dtype=jnp.int8,  # noqa: E731
                              nu_dtype=jnp.int8)
  state, params, _ = _fused_and_unfused(rng, make, implementation, interpret,
                                        widths=(600, 7))
  mu = state.forge_state["fc1"]["mu"]
  assert isinstance(mu, q.QuantizedArray) and mu.codes.dtype == jnp.int8
  assert mu.codes.shape == (13, 600 // 2**fold_level)
  for layer in ("fc1", "fc2"):
    # A one-code difference of a moment, from the order of a sum, is allowed.
    assert rel_err(state.params[layer]["kernel"], params[layer]["kernel"]) <= 1e-4


def test_fold_level_0_fused_is_fused_adamw(rng):
  seed = int(rng.integers(2**31))  # the same data for both runs
  a, _, _ = _fused_and_unfused(
      np.random.default_rng(seed),
      lambda: fj.fold_adam(LR, fold_level=0, weight_decay=0.1), "xla", False)
  b, _, _ = _fused_and_unfused(
      np.random.default_rng(seed), lambda: fj.adamw(LR, weight_decay=0.1), "xla", False)
  for layer in ("fc1", "fc2"):
    assert rel_err(a.params[layer]["kernel"], b.params[layer]["kernel"]) <= 1e-6
    assert rel_err(a.forge_state[layer]["nu"], b.forge_state[layer]["nu"]) <= 1e-6


def _hp(rule, count=4):
  return rule.pack(dict(learning_rate=1e-2, b1=0.9, b2=0.95, eps=1e-8, eps_root=0.0,
                        scale=0.25, weight_decay=0.1), count)


@pytest.mark.parametrize("interpret", [True] + ([False] if ON_GPU else []))
@pytest.mark.parametrize("fold_level,d_out,state_dtype", [
    (2, 130, jnp.float32), (3, 64, jnp.float32), (4, 33, jnp.float32),
    (3, 1000, jnp.int8), (2, 300, jnp.bfloat16)])
def test_kernel_matches_reference(rng, fold_level, d_out, state_dtype, interpret):
  rule = FoldAdamRule(fold_level)
  t, d_in = 37, 45
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  shape = rule.state_shape(w.shape)
  mu = jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32)
  nu = jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32) ** 2
  if state_dtype == jnp.int8:
    state = (q.quantize(mu), q.quantize(nu, nonnegative=True))
  else:
    state = (mu.astype(state_dtype), nu.astype(state_dtype))
  want_w, want_s = fused_dw_update_reference(x, dy, w, state, _hp(rule), rule=rule)
  got_w, got_s = fused_dw_update(x, dy, w, state, _hp(rule), rule=rule,
                                 implementation="triton", interpret=interpret)
  assert rel_err(got_w, want_w) < 1e-5
  for g, r in zip(got_s, want_s):
    assert rel_err(q.state_to_f32(g), q.state_to_f32(r)) < (1e-2 if state_dtype == jnp.int8
                                                            else 1e-5)


def test_kernel_lowers_to_triton_with_folded_int8_state():
  text = triton_text_with_int8_state(FoldAdamRule(3), 64, 256, 1024, min_block_n=512)
  assert "__gpu$xla.gpu.triton" in text
  assert text.count("tf.aliasing_output") == 5


def test_tiles_must_hold_whole_fold_blocks(rng):
  rule = FoldAdamRule(3)
  x, dy = jnp.ones((8, 16)), jnp.ones((8, 64))
  w = jnp.ones((16, 64))
  state = tuple(jnp.zeros(rule.state_shape(w.shape)) for _ in range(2))
  # fp32 state: a 16-wide tile holds two blocks of 8 (and their 2 state columns).
  got, _ = fused_dw_update(x, dy, w, state, _hp(rule), rule=rule,
                           implementation="triton", interpret=True,
                           config=FusedDWConfig(16, 16, 16))
  want, _ = fused_dw_update_reference(x, dy, w, state, _hp(rule), rule=rule)
  assert rel_err(got, want) < 1e-6
  with pytest.raises(ValueError, match="block_n=16 must be a multiple of 32 for "
                     "rule 'fold_adam_l5'"):
    r5 = FoldAdamRule(5)
    fused_dw_update(x, dy, w, tuple(jnp.zeros(r5.state_shape(w.shape)) for _ in "ab"),
                    _hp(r5), rule=r5, implementation="triton", interpret=True,
                    config=FusedDWConfig(16, 16, 16))
  q_state = (q.quantize(state[0]), q.quantize(state[1], nonnegative=True))
  with pytest.raises(ValueError, match="block_n=128 must be a multiple of 512 for "
                     "rule 'fold_adam_l3' with int8 state"):
    fused_dw_update(x, dy, w, q_state, _hp(rule), rule=rule, implementation="triton",
                    interpret=True, config=FusedDWConfig(16, 128, 16))
  with pytest.raises(ValueError, match=r"must be float32 or bfloat16 of shape \(16, 8\)"):
    fused_dw_update(x, dy, w, (jnp.zeros((16, 64)),) * 2, _hp(rule), rule=rule,
                    implementation="xla")
  assert FusedDWConfig.default(64, 1024, 4096, jnp.bfloat16, min_block_n=1024) == \
      FusedDWConfig(16, 1024, 64, num_warps=8, num_stages=3)


def test_fold_adam_with_a_weight_decay_mask_cannot_be_fused():
  tx = fj.fold_adam(1e-3, 2, mask={"kernel": True})
  assert not isinstance(tx, fj.ForgeTransformation)
  with pytest.raises(TypeError, match="ForgeDense.optimizer must be a forge_jax fused"):
    fj.ForgeDense(4, optimizer=tx).init(jax.random.key(0), jnp.ones((2, 3)))


@pytest.mark.parametrize("fold_level,state_dtype", [(3, jnp.float32), (2, jnp.int8)])
def test_kernel_with_epilogue_split_matches_reference(rng, fold_level, state_dtype):
  """Folded moments updated chunk by chunk (each chunk holds whole fold
  blocks): the same as the reference."""
  rule = FoldAdamRule(fold_level)
  x = jnp.asarray(rng.standard_normal((37, 45)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((37, 700)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((45, 700)), jnp.float32)
  shape = rule.state_shape(w.shape)
  mu = jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32)
  nu = jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32) ** 2
  state = ((q.quantize(mu), q.quantize(nu, nonnegative=True))
           if state_dtype == jnp.int8 else (mu, nu))
  block_n = 512 if state_dtype == jnp.int8 else 64
  cfg = FusedDWConfig(16, block_n, 16, num_warps=4, num_stages=1, epilogue_split=2)
  want_w, want_s = fused_dw_update_reference(x, dy, w, state, _hp(rule), rule=rule)
  got_w, got_s = fused_dw_update(x, dy, w, state, _hp(rule), rule=rule,
                                 implementation="triton", interpret=True, config=cfg)
  assert rel_err(got_w, want_w) < 1e-5
  for g, r in zip(got_s, want_s):
    assert rel_err(q.state_to_f32(g), q.state_to_f32(r)) < (
        1e-2 if state_dtype == jnp.int8 else 1e-5)
