"""Optimizer state stored as bf16 or int8 (absmax blocks of 64): the quantizer,
the kernel against its reference, fused against unfused, checkpoints."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import ON_GPU
from conftest import TwoLayerMLP
from conftest import fused_and_unfused
from conftest import rel_err
from conftest import triton_text_with_int8_state
import forge_jax as fj
from forge_jax.rules import ALL_RULES
from pallas_kernels import quantization as q
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference

BACKENDS = [("triton", True)] + ([("triton", False)] if ON_GPU else [])


# ---------------------------------------------------------------------------
# The quantizer.


def _step(qa):
  """Per-element size of one code step, broadcast to the array's shape."""
  nb = q.num_blocks(qa.shape[-1])
  s = np.repeat(np.asarray(qa.scale).reshape(qa.shape[:-1] + (nb,)),
                q.BLOCK_SIZE, axis=-1)[..., :qa.shape[-1]]
  return s


@pytest.mark.parametrize("shape", [(3, 130), (64,), (1,), (2, 3, 65), (5, 1)])
def test_signed_round_trip_is_within_half_a_step(rng, shape):
  x = rng.standard_normal(shape).astype(np.float32) * np.exp(rng.standard_normal(shape))
  qa = q.quantize(x)
  assert qa.codes.dtype == jnp.int8 and qa.codes.shape == shape
  assert qa.scale.dtype == jnp.float32 and qa.scale.shape == q.scale_shape(shape)
  err = np.abs(np.asarray(q.dequantize(qa)) - x)
  assert np.all(err <= 0.5 * _step(qa) * (1 + 1e-5) + 1e-30)
  # The absmax of each block is represented (code ±127) up to rounding.
  assert int(np.max(np.abs(np.asarray(qa.codes, np.int32)))) == 127


@pytest.mark.parametrize("shape", [(3, 130), (64,), (2, 3, 65)])
def test_nonnegative_code_keeps_small_values_and_never_decodes_positive_to_zero(rng, shape):
  x = (rng.standard_normal(shape).astype(np.float32) ** 2) * np.float32(1e-3)
  x.reshape(-1)[:: 7] *= np.float32(1e-6)  # values 1e-6 of their neighbours'
  qa = q.quantize(x, nonnegative=True)
  back = np.asarray(q.dequantize(qa))
  assert np.all(back[x > 0] > 0)
  # In the square-root domain the error is at most half a step ...
  err = np.abs(np.sqrt(back) - np.sqrt(x))
  tiny = np.sqrt(x) < _step(qa)  # ... except that positive codes are >= 1
  assert np.all(err[~tiny] <= 0.5 * _step(qa)[~tiny] * (1 + 1e-5))
  assert np.all(np.sqrt(back[tiny]) <= _step(qa)[tiny] * (1 + 1e-5))
  # Relative to its block's maximum, 1e-2 keeps 5%, 1e-4 a factor below 2.
  y = np.zeros(64, np.float32)
  y[0], y[1], y[2] = 1.0, 1e-4, 1e-2
  yb = np.asarray(q.dequantize(q.quantize(y, nonnegative=True)))
  assert 0.5 < yb[1] / 1e-4 < 2 and abs(yb[2] / 1e-2 - 1) < 0.05 and yb[3] == 0
  # The signed linear code would have lost it.
  assert float(q.dequantize(q.quantize(y))[1]) == 0.0


@pytest.mark.parametrize("nonnegative", [False, True])
def test_all_zero_block_has_scale_zero_and_no_nan(nonnegative):
  x = np.zeros((2, 130), np.float32)
  x[1, 70] = 3.0  # only the second row's second block is non-zero
  qa = q.quantize(x, nonnegative)
  scale = np.asarray(qa.scale)
  assert scale[0].tolist() == [0, 0, 0] and scale[1, 0] == 0 and scale[1, 2] == 0
  back = np.asarray(q.dequantize(qa))
  assert np.all(np.isfinite(back))
  np.testing.assert_allclose(back, x, rtol=1e-6)


def test_blocks_do_not_cross_rows(rng):
  x = rng.standard_normal((4, 100)).astype(np.float32)
  y = x.copy()
  y[2] *= 1000
  a, b = q.quantize(x), q.quantize(y)
  rows = [0, 1, 3]
  np.testing.assert_array_equal(np.asarray(a.codes)[rows], np.asarray(b.codes)[rows])
  np.testing.assert_array_equal(np.asarray(a.scale)[rows], np.asarray(b.scale)[rows])


def test_signed_block_below_1e30_is_stored_as_zeros_without_nan():
  x = np.zeros(64, np.float32)
  x[:3] = [1e-37, -2e-38, 5e-38]  # 127 / 1e-37 would overflow
  qa = q.quantize(x)
  back = np.asarray(q.dequantize(qa))
  assert float(qa.scale[0]) == 0.0 and np.all(back == 0)
  assert np.all(np.asarray(qa.codes) == 0)


@pytest.mark.parametrize("nonnegative", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_inf_poisons_its_block_only(nonnegative, bad):
  # Not silently zeros (a signed NaN block used to fail the 1e-30 test and
  # be stored as 0): the block decodes to inf or NaN, the others are kept.
  # Many blocks: XLA's CPU max over many blocks may skip a NaN, so the NaN
  # is flagged separately.
  x = np.ones((128, 256), np.float32)
  x[1, 70] = bad
  back = np.array(q.dequantize(q.quantize(x, nonnegative)))
  assert not np.any(np.isfinite(back[1, 64:128]))
  back[1, 64:128] = 1.0
  np.testing.assert_allclose(back, 1.0, rtol=1e-6)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_row_layout_equals_blocked_layout_and_flags_nan(nonnegative):
  # The Mosaic kernel quantizes (rows, 64) sub-tiles, one block per row; the
  # Triton kernel and quantize() use (..., blocks, 64) views.
  v = np.abs(np.random.default_rng(3).standard_normal((128, 64))).astype(np.float32)
  v[5, 9] = np.nan
  codes, scale = q.quantize_blocks(jnp.asarray(v), nonnegative)
  want_codes, want_scale = q.quantize_blocks(jnp.asarray(v[:, None, :]), nonnegative)
  assert np.isnan(np.asarray(scale)[5]) and np.isnan(np.asarray(want_scale)[5, 0])
  keep = np.arange(128) != 5
  np.testing.assert_array_equal(np.asarray(scale)[keep], np.asarray(want_scale)[keep, 0])
  np.testing.assert_array_equal(np.asarray(codes)[keep], np.asarray(want_codes)[keep, 0])
  back = np.asarray(q.dequantize_blocks(codes, scale, nonnegative))
  assert np.all(np.isnan(back[5]))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 5), (0, 0), (2, 0, 64)])
def test_degenerate_shapes(shape):
  x = np.full(shape, -2.5, np.float32)
  qa = q.quantize(x)
  assert qa.codes.shape == shape and qa.scale.shape == q.scale_shape(shape)
  np.testing.assert_allclose(np.asarray(q.dequantize(qa)), x, rtol=1e-6)
  # Optimizers with int8 state accept such params.
  params = {"w": jnp.zeros(shape)}
  for tx in (fj.adamw(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
             fj.fold_adam(1e-3, 2, mu_dtype=jnp.int8, nu_dtype=jnp.int8)):
    u, _ = jax.jit(tx.update)(params, tx.init(params), params)
    assert u["w"].shape == shape


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (64,), (3, 65), (2, 5, 130)])
@pytest.mark.parametrize("value", [0.0, 0.1, -3.25])
@pytest.mark.parametrize("nonnegative", [False, True])
def test_full_state_equals_quantizing_a_full_array(shape, value, nonnegative):
  if nonnegative and value < 0:
    value = -value
  got = q.full_state(shape, value, jnp.int8, nonnegative)
  want = q.quantize(np.full(shape, value, np.float32), nonnegative)
  assert got.codes.dtype == want.codes.dtype and got.nonnegative == nonnegative
  np.testing.assert_array_equal(np.asarray(got.codes), np.asarray(want.codes))
  # absmax / 127: XLA may compile the division differently for the two
  # shapes (1 ulp).
  np.testing.assert_allclose(np.asarray(got.scale), np.asarray(want.scale),
                             rtol=2.5e-7, atol=0)
  for dtype in (jnp.float32, jnp.bfloat16):
    arr = q.full_state(shape, value, dtype, nonnegative)
    assert arr.dtype == dtype and arr.shape == shape
    np.testing.assert_array_equal(
        np.asarray(arr, np.float32),
        np.asarray(jnp.full(shape, value, jnp.float32).astype(dtype), np.float32))


def test_int8_state_init_makes_no_fp32_array_of_the_param_shape():
  # Eager init of int8 moments for a large leaf must not hold fp32 of it.
  shape = (4, 256, 512)
  jaxpr = str(jax.make_jaxpr(lambda: q.full_state(shape, 0.0, jnp.int8, True))())
  assert "f32[4,256,512]" not in jaxpr and "i8[4,256,512]" in jaxpr


def test_int8_state_of_a_constant_is_two_broadcasts_under_jit():
  # A jitted init of many int8 leaves holds no quantization ops per leaf
  # (they made up 83% of an unrolled Llama-3.1-8B init's HLO); a traced value
  # still quantizes, to the same code and scale.
  shape = (4, 128)
  jaxpr = jax.make_jaxpr(lambda: q.full_state(shape, 0.0, jnp.int8, True))()
  assert {e.primitive.name for e in jaxpr.eqns} == {"broadcast_in_dim"}
  for value, nonneg in ((0.0, True), (0.25, True), (-3.25, False)):
    want = q.full_state(shape, value, jnp.int8, nonneg)
    got = jax.jit(lambda v, n=nonneg: q.full_state(shape, v, jnp.int8, n))(value)
    np.testing.assert_array_equal(np.asarray(got.codes), np.asarray(want.codes))
    np.testing.assert_allclose(np.asarray(got.scale), np.asarray(want.scale),
                               rtol=2.5e-7, atol=0)


def test_state_dtype_is_validated():
  with pytest.raises(ValueError, match="mu_dtype=.*float16.* must be one of"):
    fj.adamw(1e-3, mu_dtype=jnp.float16)
  with pytest.raises(ValueError, match="nu_dtype='int4' must be one of"):
    fj.scale_by_adamw(nu_dtype="int4")
  with pytest.raises(ValueError, match="accumulator_dtype needs a momentum"):
    fj.sgd(0.1, accumulator_dtype=jnp.int8)


def test_int8_state_bytes_are_a_quarter_and_a_bit():
  params = {"w": jnp.zeros((256, 512)), "b": jnp.zeros((512,))}
  n = 256 * 512 + 512

  def nbytes(tx):
    return sum(x.nbytes for x in jax.tree.leaves(tx.init(params)))

  f32 = nbytes(fj.adamw(1e-3))
  bf16 = nbytes(fj.adamw(1e-3, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16))
  int8 = nbytes(fj.adamw(1e-3, mu_dtype=jnp.int8, nu_dtype=jnp.int8))
  assert f32 == 2 * 4 * n + 4  # + the int32 count
  assert bf16 == 2 * 2 * n + 4
  assert int8 == 2 * (n + 4 * n // 64) + 4  # codes + one fp32 scale per 64


# ---------------------------------------------------------------------------
# The kernel against its reference.

_RAW = {"learning_rate": 0.01, "b1": 0.9, "b2": 0.9, "eps": 1e-8, "threshold": 5.0,
        "weight_decay": 0.05, "decay": 0.9, "momentum": 0.9}


def _state(rng, rule, shape, dtypes):
  out = []
  for name, d in zip(rule.state_names, dtypes):
    v = rng.standard_normal(shape).astype(np.float32) * 0.1
    if name in rule.nonnegative_states:
      v = v * v
    if d == jnp.int8:
      out.append(q.quantize(v, name in rule.nonnegative_states))
    else:
      out.append(jnp.asarray(v, d))
  return tuple(out)


def _assert_states_close(got, want, rtol):
  for g, w in zip(got, want):
    if isinstance(w, q.QuantizedArray):
      assert g.nonnegative == w.nonnegative
      gv, wv = np.asarray(q.dequantize(g)), np.asarray(q.dequantize(w))
      # A code may differ by one where rounding of the fp32 gradient tips it.
      step = np.maximum(_step(w), _step(g))
      if w.nonnegative:
        gv, wv = np.sqrt(gv), np.sqrt(wv)
      assert np.all(np.abs(gv - wv) <= step * 1.001 + 1e-30)
      assert np.mean(np.asarray(g.codes) != np.asarray(w.codes)) < 0.01
      assert rel_err(g.scale, w.scale) < rtol
    else:
      assert g.dtype == w.dtype
      assert rel_err(g.astype(jnp.float32), w.astype(jnp.float32)) < rtol


@pytest.mark.parametrize("impl,interpret", BACKENDS)
@pytest.mark.parametrize("rule", [r for r in ALL_RULES if r.state_names],
                         ids=lambda r: r.name)
@pytest.mark.parametrize("t,d_in,d_out", [(45, 37, 130), (1, 3, 1), (70, 64, 64)])
def test_kernel_with_int8_state_matches_reference(rng, rule, t, d_in, d_out, impl,
                                                  interpret):
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.float32)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  state = _state(rng, rule, (d_in, d_out), [jnp.int8] * len(rule.state_names))
  hp = rule.pack({n: _RAW[n] for n in rule.hyperparam_names}, 7)
  want_w, want_state = fused_dw_update_reference(x, dy, w, state, hp, rule=rule)
  got_w, got_state = fused_dw_update(
      x, dy, w, state, hp, rule=rule, implementation=impl, interpret=interpret,
      config=FusedDWConfig(16, 64, 16, 2, 4, 1) if interpret else None)
  assert rel_err(got_w, want_w) < 1e-5
  _assert_states_close(got_state, want_state, 1e-5)


@pytest.mark.parametrize("impl,interpret", BACKENDS)
def test_kernel_with_mixed_state_dtypes_and_bf16_weights(rng, impl, interpret):
  rule = fj.rules.ADAMW
  t, d_in, d_out = 33, 50, 200
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.bfloat16)
  for dtypes in [(jnp.bfloat16, jnp.int8), (jnp.int8, jnp.float32),
                 (jnp.bfloat16, jnp.bfloat16)]:
    state = _state(rng, rule, (d_in, d_out), dtypes)
    hp = rule.pack({n: _RAW[n] for n in rule.hyperparam_names}, 3)
    seed = jnp.uint32(99)
    want_w, want_state = fused_dw_update_reference(x, dy, w, state, hp, rule=rule,
                                                   seed=seed)
    got_w, got_state = fused_dw_update(x, dy, w, state, hp, rule=rule,
                                       implementation=impl, interpret=interpret,
                                       seed=seed)
    assert got_w.dtype == jnp.bfloat16
    # bf16 weights: equal but for rare one-ULP differences of the rounding.
    assert np.mean(np.asarray(got_w != want_w)) < 0.01
    _assert_states_close(got_state, want_state, 1e-2)


def test_int8_state_needs_tiles_of_whole_blocks(rng):
  rule = fj.rules.ADAMW
  x = jnp.ones((8, 16))
  w = jnp.ones((16, 128))
  state = _state(rng, rule, (16, 128), [jnp.int8, jnp.int8])
  hp = rule.pack({n: _RAW[n] for n in rule.hyperparam_names}, 1)
  with pytest.raises(ValueError, match="block_n=32 must be a multiple of 64"):
    fused_dw_update(x, jnp.ones((8, 128)), w, state, hp, rule=rule,
                    implementation="triton", interpret=True,
                    config=FusedDWConfig(16, 32, 16))
  swapped = (q.quantize(np.ones((16, 128), np.float32), nonnegative=True), state[1])
  with pytest.raises(ValueError, match="'mu' must be quantized with nonnegative=False"):
    fused_dw_update(x, jnp.ones((8, 128)), w, swapped, hp, rule=rule,
                    implementation="xla")
  bad = (q.QuantizedArray(state[0].codes, state[0].scale[:, :1]), state[1])
  with pytest.raises(ValueError, match="float32 scales of shape"):
    fused_dw_update(x, jnp.ones((8, 128)), w, bad, hp, rule=rule, implementation="xla")
  assert FusedDWConfig.default(64, 16, 16, jnp.float32, min_block_n=64).block_n == 64


def test_kernel_with_int8_state_lowers_to_triton_with_aliases():
  text = triton_text_with_int8_state(fj.rules.ADAMW, 64, 256, 256, min_block_n=64)
  assert "__gpu$xla.gpu.triton" in text
  assert text.count("tf.aliasing_output") == 5  # w, 2 codes, 2 scales in place


def test_kernel_with_sharded_stochastic_rounding_lowers_to_triton():
  """The seed operand [seed, row0, col0] of a tensor-parallel shard lowers."""
  text = triton_text_with_int8_state(fj.rules.ADAMW, 64, 256, 256, min_block_n=64,
                                     sharded_rounding=True)
  assert "__gpu$xla.gpu.triton" in text
  assert "tensor<3xui32>" in text
  assert text.count("tf.aliasing_output") == 5


# ---------------------------------------------------------------------------
# ForgeDense and the fused step with low-precision state.


MLP = functools.partial(TwoLayerMLP, widths=(70, 7))
LR = optax.linear_schedule(3e-2, 3e-3, 8)
LOW_PRECISION = {
    "adamw_int8": lambda: fj.adamw(LR, weight_decay=0.1, mu_dtype=jnp.int8,
                                   nu_dtype=jnp.int8),
    "adamw_bf16": lambda: fj.adamw(LR, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16),
    "nadamw_int8_nu": lambda: fj.nadamw(LR, nu_dtype=jnp.int8),
    "radam_int8": lambda: fj.radam(LR, b2=0.9, mu_dtype=jnp.int8, nu_dtype=jnp.int8),
    "lion_int8": lambda: fj.lion(LR, mu_dtype=jnp.int8),
    "rmsprop_int8": lambda: fj.rmsprop(LR, nu_dtype=jnp.int8),
    "adagrad_int8": lambda: fj.adagrad(LR, sum_of_squares_dtype=jnp.int8),
    "sgd_momentum_int8": lambda: fj.sgd(LR, momentum=0.9, accumulator_dtype=jnp.int8),
}


@pytest.mark.parametrize("implementation,interpret", [("xla", False), ("triton", True)])
@pytest.mark.parametrize("name", sorted(LOW_PRECISION))
def test_fused_matches_unfused_with_low_precision_state(rng, name, implementation,
                                                        interpret):
  state, params, _, sizes = fused_and_unfused(
      rng, LOW_PRECISION[name], implementation=implementation, interpret=interpret,
      widths=(70, 7))
  # On the GPU the unfused gradient comes from XLA's dot and the fused one
  # from another summation order; a last-bit difference can move an int8
  # code by one step (1/127 of its block's max: measured 6e-5 on the H200
  # after 8 steps), and bit-for-bit agreement is not expected there.
  tol = 3e-4 if ON_GPU and "int8" in name else 1e-5
  for layer in ("fc1", "fc2"):
    for leaf in ("kernel", "bias"):
      assert rel_err(state.params[layer][leaf], params[layer][leaf]) <= tol, (layer, leaf)
  # The fused layers' state is stored as asked (int8 codes, not their view).
  dtypes = {x.dtype for x in jax.tree.leaves(state.forge_state["fc1"])}
  assert jnp.dtype(jnp.float8_e4m3fn) not in dtypes
  assert dtypes & {jnp.dtype(jnp.int8), jnp.dtype(jnp.bfloat16)}
  # The state a step returns is a valid input of the next without retracing
  # (on the H200, interpret mode has been seen to compile once more after the
  # first step, never after the second).
  assert sizes[-1] == sizes[1] and (ON_GPU or sizes[-1] == 1), sizes


def test_state_from_another_configuration_is_refused(rng):
  x = jnp.ones((2, 5))
  v = MLP(fj.adamw(1e-2)).init(jax.random.key(0), x)
  state = fj.TrainState.create(apply_fn=None, variables=v, tx=optax.sgd(0.1))
  m8 = MLP(fj.adamw(1e-2, mu_dtype=jnp.int8))
  step = fj.make_train_step(lambda vv, b: jnp.sum(m8.apply(vv, b)))
  with pytest.raises(ValueError, match="mu is stored as float32 but the optimizer's "
                     "mu_dtype is int8"):
    step(state, x)


@pytest.mark.parametrize("state_dtype", [jnp.bfloat16, jnp.int8])
def test_resume_with_low_precision_state_is_bit_identical(rng, tmp_path, state_dtype):
  opt = fj.adamw(1e-2, mu_dtype=state_dtype, nu_dtype=state_dtype)
  model = MLP(opt, param_dtype=jnp.bfloat16)
  x = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
  v = model.init(jax.random.key(0), x)
  state = fj.TrainState.create(apply_fn=model.apply, variables=v,
                               tx=fj.adamw(1e-2, mu_dtype=state_dtype,
                                           nu_dtype=state_dtype), seed=7)
  template = jax.tree.map(jnp.copy, state)
  step = fj.make_train_step(lambda vv, b: jnp.mean(model.apply(vv, b) ** 2))
  for _ in range(3):
    state, _ = step(state, x)
  fj.save_checkpoint(tmp_path, state)
  uninterrupted = state
  for _ in range(2):
    uninterrupted, _ = step(uninterrupted, x)
  restored, _ = fj.restore_checkpoint(tmp_path, template)
  for _ in range(2):
    restored, _ = step(restored, x)
  got, want = jax.tree.leaves(restored), jax.tree.leaves(uninterrupted)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_restore_into_another_state_or_param_dtype_is_refused(rng, tmp_path):
  x = jnp.ones((6, 5))

  def make(state_dtype, param_dtype=jnp.float32):
    opt = fj.adamw(1e-2, mu_dtype=state_dtype, nu_dtype=state_dtype)
    v = MLP(opt, param_dtype=param_dtype).init(jax.random.key(0), x)
    return fj.TrainState.create(apply_fn=None, variables=v, tx=optax.adamw(1e-2))

  fj.save_checkpoint(tmp_path, make(jnp.int8))
  with pytest.raises(ValueError, match=r"fc1.*mu.*missing from the checkpoint|"
                     r"not in the target.*codes"):
    fj.restore_checkpoint(tmp_path, make(jnp.float32))
  fj.save_checkpoint(tmp_path / "b", make(jnp.bfloat16))
  with pytest.raises(ValueError, match=r"checkpoint has bfloat16\[5, 70\], target "
                     r"wants float32\[5, 70\]"):
    fj.restore_checkpoint(tmp_path / "b", make(jnp.float32))
  with pytest.raises(ValueError, match=r"'kernel'\]: checkpoint has float32\[5, 70\], "
                     r"target wants bfloat16\[5, 70\]"):
    fj.restore_checkpoint(tmp_path / "b", make(jnp.bfloat16, jnp.bfloat16))
  restored, _ = fj.restore_checkpoint(tmp_path, make(jnp.int8))
  assert restored.forge_state["fc1"]["mu"].codes.dtype == jnp.int8


@pytest.mark.parametrize("name", ["adamw", "lion", "rmsprop"])
@pytest.mark.parametrize("shape", [(37, 192), (16, 3, 64), (1000,)])
def test_large_int8_leaves_updated_in_slabs_equal_the_whole(monkeypatch, name, shape):
  """A leaf past 2·CHUNK_ELEMENTS gets its int8 states in row slabs (a loop
  and a partial last slab): bit for bit the states of the whole-leaf update,
  and the same direction; 1-D leaves are never split."""
  from forge_jax._src import transforms
  make = {"adamw": lambda: fj.adamw(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8,
                                    weight_decay=0.1),
          "lion": lambda: fj.lion(1e-3, mu_dtype=jnp.int8),
          "rmsprop": lambda: fj.rmsprop(1e-3, nu_dtype=jnp.int8)}[name]
  k = jax.random.split(jax.random.key(5), 4)
  params = {"w": jax.random.normal(k[0], shape, jnp.bfloat16),
            "b": jax.random.normal(k[1], (shape[-1],), jnp.float32)}
  grads = [jax.tree.map(lambda p, i=i: jax.random.normal(
      jax.random.fold_in(k[2], i), p.shape, p.dtype), params) for i in range(3)]

  def run(chunk_elements):
    monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", chunk_elements)
    tx = make()
    state, outs = tx.init(params), []
    step = jax.jit(tx.update)
    for g in grads:
      u, state = step(g, state, params)
      outs.append(u)
    return outs, state, jax.make_jaxpr(tx.update)(grads[0], state, params)

  whole, whole_state, jaxpr_whole = run(1 << 30)
  slabs, slab_state, jaxpr_slabs = run(64 * 5)  # 5 rows of 64 per slab or so
  split = len(shape) >= 2
  looped = lambda jaxpr: any(w in str(jaxpr) for w in ("while[", "scan["))  # noqa: E731
  assert looped(jaxpr_slabs) == split and not looped(jaxpr_whole)
  for a, b in zip(jax.tree.leaves((whole, whole_state)),
                  jax.tree.leaves((slabs, slab_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices of the "
                    "default backend (CI: two host CPUs)")
def test_sharded_leaves_are_not_split_into_slabs(monkeypatch):
  """A leaf split over an explicit mesh axis keeps the whole-leaf update (a
  slab of a row-split leaf would be gathered onto every device); the same
  leaf unsharded is split."""
  from forge_jax._src import transforms
  monkeypatch.setattr(transforms, "CHUNK_ELEMENTS", 64)
  mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
  tx = fj.adamw(1e-2, mu_dtype=jnp.int8, nu_dtype=jnp.int8)
  for spec, slabs in ((("d", None), False), ((None, "d"), False), (None, True)):
    w = jax.random.normal(jax.random.key(1), (8, 256))  # None: on one device
    if spec is not None:
      w = jax.device_put(w, jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec(*spec)))
    state = tx.init({"w": w})
    jaxpr = str(jax.make_jaxpr(tx.update)({"w": w}, state, {"w": w}))
    assert any(k in jaxpr for k in ("while[", "scan[")) == slabs, spec


@pytest.mark.parametrize("shape", [(3, 130), (2, 5, 64), (1, 1)])
@pytest.mark.parametrize("nonnegative", [False, True])
def test_transposed_scale_layout_holds_the_same_values(rng, shape, nonnegative):
  x = rng.standard_normal(shape).astype(np.float32)
  x = x * x if nonnegative else x
  natural = q.quantize(x, nonnegative)
  t = q.quantize(x, nonnegative, scale_transposed=True)
  assert t.scale_transposed and t.scale.shape == q.scale_shape(shape, True)
  assert t.scale.shape == shape[:-2] + (q.num_blocks(shape[-1]), shape[-2])
  np.testing.assert_array_equal(np.asarray(t.codes), np.asarray(natural.codes))
  np.testing.assert_array_equal(np.asarray(q.natural_scale(t)),
                                np.asarray(natural.scale))
  np.testing.assert_array_equal(np.asarray(q.dequantize(t)),
                                np.asarray(q.dequantize(natural)))
  # full_state and state_from_f32 keep the layout
  full = q.full_state(shape, 0.5, jnp.int8, nonnegative, scale_transposed=True)
  assert full.scale_transposed and full.scale.shape == t.scale.shape
  again = q.state_from_f32(jnp.asarray(x), t)
  assert again.scale_transposed
  np.testing.assert_array_equal(np.asarray(again.scale), np.asarray(t.scale))


def test_transposed_scale_layout_needs_two_axes():
  with pytest.raises(ValueError, match="at least two axes"):
    q.quantize(np.ones((64,), np.float32), scale_transposed=True)
  with pytest.raises(ValueError, match="at least two axes"):
    q.scale_shape((64,), scale_transposed=True)


def test_forge_dense_keeps_int8_scales_in_the_kernel_layout(rng):
  # (in, out) kernel: moments' codes (in, out), scales (out / 64, in); a
  # 1-D bias stays with the optax transform (not fused).
  model = fj.ForgeDense(128, optimizer=fj.adamw(1e-3, mu_dtype=jnp.int8,
                                                 nu_dtype=jnp.int8))
  variables = model.init(jax.random.key(0), jnp.ones((2, 48)))
  for name in ("mu", "nu"):
    s = variables["forge_state"][name]
    assert isinstance(s, q.QuantizedArray) and s.scale_transposed
    assert s.codes.shape == (48, 128) and s.scale.shape == (2, 48)
