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
from pallas_kernels.fused_dw import MosaicConfig
from pallas_kernels.fused_dw import kernel_mosaic
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


# --- FOAM on the Mosaic GPU kernel (TMA + wgmma) ------------------------------
# The folded moments travel transposed, (out / 2**l, in); each fold block's
# moments are one row, summed within the accumulator's quads. On the CPU the
# kernel runs in Mosaic GPU interpret mode, on a GPU also compiled.

MOSAIC_INTERPRET = [True] + ([False] if ON_GPU else [])
MOSAIC_TILE = MosaicConfig(block_m=64, block_n=64, block_t=64, max_concurrent_steps=2)


def _mosaic_inputs(rng, shape):
  t, d_in, d_out = shape
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)
  return x, dy


@pytest.mark.parametrize("interpret", MOSAIC_INTERPRET)
@pytest.mark.parametrize("fold_level", [3, 4, 5, 6])
def test_mosaic_kernel_equals_the_optax_transform_for_5_steps(rng, fold_level,
                                                              interpret):
  """Five steps of the fused Mosaic op, fresh x and dY each step, against the
  optax fold_adam transform on the materialized fp32 gradient."""
  tx = fj.fold_adam(LR, fold_level=fold_level, weight_decay=0.1, scale=0.5)
  rule = tx.rule
  w = jnp.asarray(rng.standard_normal((128, 192)), jnp.float32)
  params = {"kernel": w}
  opt_state = tx.init(params)
  fused_w = w
  state = (jnp.zeros(rule.state_shape(w.shape)),) * 2  # the transform's init
  op = jax.jit(lambda *a: fused_dw_update(*a, rule=rule, implementation="mosaic",
                                          config=MOSAIC_TILE, interpret=interpret))
  for step in range(5):
    x, dy = _mosaic_inputs(rng, (128, 128, 192))
    grad = jnp.dot(x.astype(jnp.float32).T, dy.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)
    updates, opt_state = tx.update({"kernel": grad}, opt_state, params)
    params = optax.apply_updates(params, updates)
    fused_w, state = op(x, dy, fused_w, state, tx.packed_hyperparams(step))
  assert rel_err(fused_w, params["kernel"]) <= 1e-5
  assert rel_err(state[0], opt_state[0].mu["kernel"]) <= 1e-5
  assert rel_err(state[1], opt_state[0].nu["kernel"]) <= 1e-5


@pytest.mark.parametrize("interpret", MOSAIC_INTERPRET)
@pytest.mark.parametrize("fold_level,w_dtype,state_dtype,seed,config", [
    (3, jnp.float32, jnp.bfloat16, None, MOSAIC_TILE),
    (4, jnp.bfloat16, jnp.float32, 7, MOSAIC_TILE),
    (3, jnp.bfloat16, jnp.bfloat16, 11, MosaicConfig(block_m=64, block_n=128,
                                                     epi_slots=3)),
    (5, jnp.float32, jnp.float32, None, MosaicConfig(block_m=128, block_n=128)),
    (7, jnp.float32, jnp.float32, None, MosaicConfig(block_m=64, block_n=128,
                                                     epi_n=128)),
], ids=["fp32W-bf16state", "bf16W-SR", "bf16-all-3slots", "128x128", "l7-epi128"])
def test_mosaic_kernel_storage_formats_match_reference(rng, fold_level, w_dtype,
                                                       state_dtype, seed, config,
                                                       interpret):
  rule = FoldAdamRule(fold_level)
  x, dy = _mosaic_inputs(rng, (128, 128, 256))
  w = jnp.asarray(rng.standard_normal((128, 256)), w_dtype)
  shape = rule.state_shape(w.shape)
  mu = jnp.asarray(0.1 * rng.standard_normal(shape), state_dtype)
  nu = jnp.asarray(0.01 * rng.standard_normal(shape) ** 2, state_dtype)
  kw = {} if seed is None else dict(seed=jnp.uint32(seed))
  want_w, want_s = jax.jit(lambda *a: fused_dw_update_reference(
      *a, rule=rule, **kw))(x, dy, w, (mu, nu), _hp(rule))
  got_w, got_s = jax.jit(lambda *a: fused_dw_update(
      *a, rule=rule, implementation="mosaic", config=config, interpret=interpret,
      **kw))(x, dy, w, (mu, nu), _hp(rule))
  assert got_w.dtype == w_dtype and got_s[0].dtype == state_dtype
  assert got_s[0].shape == shape
  # fp32: rounding of the block sums' order; bf16 storage: one bf16 ulp
  # where that order moves a value across a rounding boundary.
  tol = 1e-5 if w_dtype == state_dtype == jnp.float32 else 4e-3
  assert rel_err(got_w, want_w) <= tol
  for g, r in zip(got_s, want_s):
    assert rel_err(g, r) <= tol
  if seed is not None:  # rounded stochastically: both land on bf16 neighbours
    assert float(jnp.mean((got_w == want_w).astype(jnp.float32))) > 0.99


def test_mosaic_refuses_what_its_epilogue_cannot_fold(rng):
  x, dy = _mosaic_inputs(rng, (64, 64, 128))
  w = jnp.asarray(rng.standard_normal((64, 128)), jnp.float32)

  def reason(rule, state=None, config=MOSAIC_TILE, interpret=True):
    if state is None:
      state = (jnp.zeros(rule.state_shape(w.shape)),) * 2
    return kernel_mosaic.unsupported_reason(x, dy, w, state, rule, None, config,
                                            interpret)

  assert reason(FoldAdamRule(3)) is None
  assert "fold block 4 must be at least 8" in reason(FoldAdamRule(2))
  assert "fold block 128 must be at least 8 and divide epi_n=64" in reason(
      FoldAdamRule(7))
  mu = jnp.zeros(FoldAdamRule(3).state_shape(w.shape))
  assert "int8 folded moments run on the Triton kernel" in reason(
      FoldAdamRule(3), (q.quantize(mu), q.quantize(mu, nonnegative=True)))
  with pytest.raises(ValueError, match="implementation='mosaic': rule 'fold_adam_l2'"):
    fused_dw_update(x, dy, w, (jnp.zeros((64, 32)),) * 2, _hp(FoldAdamRule(2)),
                    rule=FoldAdamRule(2), implementation="mosaic", interpret=True)
  # 'auto' on a Hopper GPU keeps l = 2 on Triton (fp32 W and folded
  # moments otherwise on Mosaic where W is large enough: the test below).
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  sds = jax.ShapeDtypeStruct
  r2 = FoldAdamRule(2)
  assert api.select_kernel(
      sds((512, 2048), jnp.bfloat16), sds((512, 8192), jnp.bfloat16),
      sds((2048, 8192), jnp.float32),
      (sds(r2.state_shape((2048, 8192)), jnp.float32),) * 2, r2, None,
      compute_capability="9.0") == "triton"


def test_mosaic_fold_lowers_for_cuda_where_concatenate_lowers(rng, monkeypatch):
  """Lowered for CUDA on the CPU: jax 0.11 lowers the folded epilogue (W and
  both transposed states aliased in place); jax 0.10's Mosaic GPU has no
  concatenate, and the compiled kernel is refused with that reason."""
  rule = FoldAdamRule(3)
  sds = jax.ShapeDtypeStruct
  args = (sds((256, 128), jnp.bfloat16), sds((256, 256), jnp.bfloat16),
          sds((128, 256), jnp.bfloat16), (sds((128, 32), jnp.float32),) * 2,
          sds((rule.num_hyperparams,), jnp.float32))
  def fn():
    return jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
        *a, rule=rule, config=MosaicConfig(), interpret=False,
        seed=jnp.uint32(3)), donate_argnums=(2, 3))

  if kernel_mosaic._lowers(jax.lax.concatenate_p):  # pylint: disable=protected-access
    text = fn().trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu") == 1
    assert text.count("tf.aliasing_output") == 3
  else:
    with pytest.raises(ValueError, match="does not lower concatenate"):
      fn().trace(*args)
  # Either way the refusal follows the lowering rules, not the version.
  monkeypatch.setattr(kernel_mosaic, "_lowers", lambda p: False)
  with pytest.raises(ValueError, match="does not lower concatenate"):
    fn().trace(*args)


def test_auto_keeps_folded_moments_beside_a_bf16_weight_on_triton(rng):
  # Measured slower on Mosaic with bf16 W (select_kernel's docstring).
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  x, dy = _mosaic_inputs(rng, (64, 64, 128))
  rule = FoldAdamRule(3)
  state = (jnp.zeros(rule.state_shape((64, 128))),) * 2
  w = jnp.zeros((64, 128), jnp.bfloat16)
  assert api.select_kernel(x, dy, w, state, rule, jnp.uint32(1),
                           compute_capability="9.0") == "triton"
  # An explicit MosaicConfig still runs it on Mosaic.
  assert api.select_kernel(x, dy, w, state, rule, jnp.uint32(1), MOSAIC_TILE,
                           compute_capability="9.0") == "mosaic"
  # fp32 W: Mosaic where W has at least one 128×128 tile per multiprocessor
  # (where this jax lowers the folded epilogue), else Triton.
  compiled = (api._jax_version() >= api._MOSAIC_AUTO_MIN_JAX  # pylint: disable=protected-access
              and kernel_mosaic._lowers(jax.lax.concatenate_p))  # pylint: disable=protected-access
  sds = jax.ShapeDtypeStruct
  for (d_in, d_out), many in (((512, 1536), False), ((2048, 8192), True)):
    got = api.select_kernel(
        sds((512, d_in), jnp.bfloat16), sds((512, d_out), jnp.bfloat16),
        sds((d_in, d_out), jnp.float32),
        (sds(rule.state_shape((d_in, d_out)), jnp.float32),) * 2, rule, None,
        compute_capability="9.0")
    assert got == ("mosaic" if many and compiled else "triton"), (d_in, d_out)


@pytest.mark.parametrize("count", [0, -1, 0.5, float("nan")])
def test_fold_rule_refuses_a_count_below_one(count):
  # 1 - b**0 = 0: the bias corrections would divide by zero (-inf weights).
  rule = fj.fold_adam(1e-2, fold_level=3).rule
  with pytest.raises(ValueError, match="1-based number of this update"):
    _hp(rule, count)
  assert bool(jnp.all(jnp.isfinite(_hp(rule, 1))))


def test_compiled_mosaic_fold_without_a_gpu_says_so_first(rng, monkeypatch):
  # The missing GPU, not a scope reason of this jax (concatenate on 0.10).
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  x, dy = _mosaic_inputs(rng, (64, 64, 128))
  rule = FoldAdamRule(3)
  w = jnp.zeros((64, 128))
  with pytest.raises(RuntimeError, match="needs a GPU backend.*interpret=True"):
    fused_dw_update(x, dy, w, (jnp.zeros(rule.state_shape(w.shape)),) * 2,
                    _hp(rule), rule=rule, implementation="mosaic")
