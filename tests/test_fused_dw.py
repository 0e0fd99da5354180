"""The fused weight-gradient + AdamW op against its unfused reference."""

import re

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

from conftest import ON_GPU, lower_for_cuda, rel_err
from forge_jax.rules import ADAMW
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference
from pallas_kernels.fused_dw import resolve_implementation

# The kernel runs in interpret mode on the CPU and compiled on a GPU; the
# compiled backend exists only where there is a GPU to compile for.
BACKENDS = [("triton", True)] + ([("triton", False)] if ON_GPU else [])
SMALL = FusedDWConfig(block_m=16, block_n=32, block_t=16, group_m=2,
                      num_warps=4, num_stages=1)


def _inputs(rng, t, d_in, d_out, dtype):
  x = jnp.asarray(rng.standard_normal((t, d_in)), dtype)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), dtype)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  mu = jnp.asarray(0.1 * rng.standard_normal((d_in, d_out)), jnp.float32)
  nu = jnp.asarray(0.1 * rng.random((d_in, d_out)), jnp.float32)
  hp = ADAMW.pack(dict(learning_rate=rng.uniform(1e-3, 1e-1), b1=0.9, b2=0.99,
                       eps=1e-8, weight_decay=0.1), rng.integers(1, 50))
  return x, dy, w, (mu, nu), hp


def _tol(dtype, t):
  # fp32 operands accumulate in fp32 (no TF32); bf16 operands are exact
  # products with fp32 sums, so both land near fp32 rounding of a T-term sum.
  return 5e-6 * max(1.0, np.sqrt(t) / 8)


@pytest.mark.parametrize("impl,interpret", BACKENDS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("t,d_in,d_out", [
    (1, 16, 16),      # one token
    (37, 45, 19),     # nothing a multiple of a tile
    (64, 1, 33),      # in = 1
    (50, 20, 1),      # out = 1
    (129, 64, 96),    # T just past a token block; several tiles in the grid
])
def test_kernel_matches_reference(rng, impl, interpret, dtype, t, d_in, d_out):
  x, dy, w, state, hp = _inputs(rng, t, d_in, d_out, dtype)
  ref_w, ref_state = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  cfg = SMALL if interpret else None
  new_w, new_state = jax.jit(
      lambda *a: fused_dw_update(*a, rule=ADAMW, implementation=impl,
                                 interpret=interpret, config=cfg))(
                                     x, dy, w, state, hp)
  for got, want in zip((new_w, *new_state), (ref_w, *ref_state)):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert bool(jnp.all(jnp.isfinite(got)))  # interpret mode reads NaN out of bounds
    assert rel_err(got, want) <= _tol(dtype, t)


@pytest.mark.parametrize("impl,interpret", BACKENDS)
@pytest.mark.parametrize("t,d_in,d_out", [(0, 16, 8), (5, 0, 8), (5, 16, 0)])
def test_empty_operands(rng, impl, interpret, t, d_in, d_out):
  x, dy, w, state, hp = _inputs(rng, t, d_in, d_out, jnp.float32)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation=impl,
                        interpret=interpret)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    assert a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_reference_is_dw_then_adamw(rng):
  """The reference equals dW = xᵀdY followed by the optax-style AdamW step."""
  x, dy, w, (mu, nu), hp = _inputs(rng, 23, 11, 7, jnp.float32)
  named, count = ADAMW.unpack(hp)
  lr, b1, b2, eps, wd = (float(named[n]) for n in ADAMW.hyperparam_names)
  count = float(count)
  g = np.asarray(x, np.float64).T @ np.asarray(dy, np.float64)
  m = b1 * np.asarray(mu, np.float64) + (1 - b1) * g
  v = b2 * np.asarray(nu, np.float64) + (1 - b2) * g * g
  u = (m / (1 - b1**count)) / (np.sqrt(v / (1 - b2**count)) + eps) + wd * np.asarray(w, np.float64)
  new_w, (new_mu, new_nu) = fused_dw_update_reference(x, dy, w, (mu, nu), hp, rule=ADAMW)
  assert rel_err(new_w, np.asarray(w, np.float64) - lr * u) < 1e-6
  assert rel_err(new_mu, m) < 1e-6
  assert rel_err(new_nu, v) < 1e-6


def test_reference_with_bf16_grad_rounds_dw_before_the_update(rng):
  """grad_dtype=bfloat16 run eagerly is the fp32 dW rounded to bf16, then the
  same update (the timing baseline of an unfused step with bf16 gradients)."""
  x, dy, w, state, hp = _inputs(rng, 40, 24, 40, jnp.bfloat16)
  got = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW,
                                  grad_dtype=jnp.bfloat16)
  g = lax.dot_general(x, dy, (((0,), (0,)), ((), ())),
                      preferred_element_type=jnp.float32)
  named, count = ADAMW.unpack(hp)
  want = ADAMW.update_masked(g.astype(jnp.bfloat16).astype(jnp.float32), w,
                             state, named, count)
  for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
    assert rel_err(a, b) <= 1e-6
  fp32 = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  # The rounding happened: the first moment moves by (1 - b1) * dW, and dW
  # rounded to bf16 differs from the fp32 dW in most elements.
  assert float(jnp.max(jnp.abs(got[1][0] - fp32[1][0]))) > 0
  assert rel_err(got[1][0], fp32[1][0]) <= 2 ** -7


@pytest.mark.parametrize("bad,shown", [
    (jnp.float16, "float16"), (jnp.int8, "int8"), ("float64", "float64"),
    ("fp8", "'fp8'"), ("bf16", "'bf16'"), (None, "None"), (float, "<class 'float'>"),
    (np.zeros(3, np.float32), "an array of float32"),
    (jnp.float32(1.0), "an array of float32"),
    (jnp.zeros(3, jnp.bfloat16), "an array of bfloat16")])
def test_reference_refuses_other_grad_dtypes(rng, bad, shown):
  x, dy, w, state, hp = _inputs(rng, 4, 8, 8, jnp.float32)
  with pytest.raises(ValueError, match=re.escape(
      f"grad_dtype={shown} must be a dtype, float32 or bfloat16")):
    fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW, grad_dtype=bad)


def test_reference_refuses_a_traced_grad_dtype(rng):
  # An array under jit is not a dtype: refused, not read as float32.
  x, dy, w, state, hp = _inputs(rng, 4, 8, 8, jnp.float32)
  with pytest.raises(ValueError, match="grad_dtype=an array of float32"):
    jax.jit(lambda g: fused_dw_update_reference(
        x, dy, w, state, hp, rule=ADAMW, grad_dtype=g))(jnp.zeros(3))


@pytest.mark.parametrize("spelling", ["bfloat16", jnp.bfloat16,
                                      jnp.dtype("bfloat16")])
def test_reference_takes_bf16_grad_dtype_spellings_and_jit(rng, spelling):
  x, dy, w, state, hp = _inputs(rng, 16, 8, 24, jnp.bfloat16)
  run = lambda g: jax.jit(lambda *a: fused_dw_update_reference(  # noqa: E731
      *a, rule=ADAMW, grad_dtype=g))(x, dy, w, state, hp)
  got, want = run(spelling), run(jnp.bfloat16)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
  # Under jit XLA may keep the bf16 dot's result in fp32 (excess precision,
  # as it may in the unfused step this mimics): within bf16 rounding of the
  # eager result, which rounds.
  eager = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW,
                                    grad_dtype=jnp.bfloat16)
  assert rel_err(got[1][0], eager[1][0]) <= 2 ** -7


def test_several_token_blocks_and_tiles_with_default_config(rng):
  x, dy, w, state, hp = _inputs(rng, 200, 130, 140, jnp.float32)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True)
  assert rel_err(got[0], ref[0]) < 1e-5


def test_implementation_switch():
  assert resolve_implementation("xla") == "xla"
  assert resolve_implementation("triton") == "triton"
  assert resolve_implementation("auto") == ("auto" if ON_GPU else "xla")
  assert resolve_implementation(None) == ("auto" if ON_GPU else "xla")
  with pytest.raises(ValueError, match="implementation='cuda'"):
    resolve_implementation("cuda")


def _op(rng, t, d_in, d_out, dtype=jnp.bfloat16, state_dtype=jnp.float32):
  x, dy, w, (mu, nu), _ = _inputs(rng, t, d_in, d_out, dtype)
  return x, dy, w, (mu.astype(state_dtype), nu.astype(state_dtype))


def test_auto_picks_mosaic_only_where_it_covers_the_op(rng, monkeypatch):
  from forge_jax._src.fold import FoldAdamRule
  from pallas_kernels import quantization
  from pallas_kernels.fused_dw import MosaicConfig
  from pallas_kernels.fused_dw import select_kernel
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(api, "_jax_version", lambda: (0, 11))  # as on the H200
  hopper = dict(compute_capability="9.0")
  x, dy, w, st = _op(rng, 128, 128, 256)
  assert select_kernel(x, dy, w, st, ADAMW, None, **hopper) == "mosaic"
  # bf16 W with stochastic rounding and bf16 states are covered too.
  wb = w.astype(jnp.bfloat16)
  sb = tuple(s.astype(jnp.bfloat16) for s in st)
  assert select_kernel(x, dy, wb, sb, ADAMW, jnp.uint32(3), **hopper) == "mosaic"
  assert select_kernel(x, dy, w, st, ADAMW, None,
                       config=MosaicConfig(block_n=64), **hopper) == "mosaic"
  # Everything else goes to Triton.
  assert select_kernel(x, dy, w, st, ADAMW, None, compute_capability="8.0") == "triton"
  assert select_kernel(x, dy, w, st, ADAMW, None, interpret=True, **hopper) == "triton"
  assert select_kernel(x, dy, w, st, ADAMW, None, config=SMALL, **hopper) == "triton"
  xf, dyf = x.astype(jnp.float32), dy.astype(jnp.float32)
  assert select_kernel(xf, dyf, w, st, ADAMW, None, **hopper) == "triton"
  # int8 states too (with their own default tile); a MosaicConfig asks for
  # Mosaic (which then covers or refuses the op) whatever the device.
  q = (quantization.quantize(st[0], False), quantization.quantize(st[1], True))
  assert select_kernel(x, dy, wb, q, ADAMW, jnp.uint32(3), **hopper) == "mosaic"
  assert select_kernel(x, dy, wb, q, ADAMW, jnp.uint32(3),
                       compute_capability="8.0") == "triton"
  # At T=8192 and Llama-3.1-8B's MLP shape (abstract shapes: only the
  # configuration is chosen): int8 states take the ping-pong tile, but fp32
  # W beside an fp32 and an int8 state overflows its shared memory and the
  # one-warpgroup tile is taken; fp32 W and states take ping-pong; folded
  # moments keep the one-warpgroup tile (ping-pong was not measured with them).
  sds = jax.ShapeDtypeStruct
  xl, dyl = sds((8192, 4096), jnp.bfloat16), sds((8192, 14336), jnp.bfloat16)
  wl = sds((4096, 14336), jnp.float32)
  ql = tuple(jax.eval_shape(lambda n=n: quantization.quantize(
      jnp.zeros((4096, 14336)), n)) for n in (False, True))
  mixed = (wl, ql[1])
  cfg = api.mosaic_default_config(xl, dyl, wl, mixed, ADAMW, None)
  assert (cfg.compute_wgs, cfg.block_m) == (1, 64)
  assert api.mosaic_default_config(
      xl, dyl, sds(wl.shape, jnp.bfloat16), ql, ADAMW, None).ping_pong
  assert api.mosaic_default_config(xl, dyl, wl, (wl, wl), ADAMW, None).ping_pong
  fold3 = FoldAdamRule(3)
  f3 = tuple(sds(fold3.state_shape(wl.shape), jnp.float32) for _ in fold3.state_names)
  assert api.mosaic_default_config(xl, dyl, wl, f3, fold3, None).compute_wgs == 1
  # bf16 W and states: ping-pong from T=2048 on, whether W is rounded
  # stochastically or not.
  wb_l = sds(wl.shape, jnp.bfloat16)
  for t, want in ((512, False), (2048, True)):
    for seed in (None, jnp.uint32(3)):
      assert api.mosaic_default_config(
          sds((t, 4096), jnp.bfloat16), sds((t, 14336), jnp.bfloat16), wb_l,
          (wb_l, wb_l), ADAMW, seed).ping_pong == want
  xs, dys, ws, ss = _op(rng, 8192, 256, 256)
  ms = (ss[0], quantization.quantize(ss[1], True))
  assert select_kernel(xs, dys, ws, ms, ADAMW, None, **hopper) == "mosaic"
  assert select_kernel(x, dy, wb, q, ADAMW, jnp.uint32(3), config=MosaicConfig(),
                       compute_capability="8.0") == "mosaic"
  fold = FoldAdamRule(2)
  fst = tuple(jnp.zeros(fold.state_shape(w.shape)) for _ in fold.state_names)
  assert select_kernel(x, dy, w, fst, fold, None, **hopper) == "triton"
  for t, d_in, d_out in [(100, 128, 256), (128, 96, 256), (128, 128, 200)]:
    xo, dyo, wo, so = _op(rng, t, d_in, d_out)
    assert select_kernel(xo, dyo, wo, so, ADAMW, None, **hopper) == "triton"
  # Only on jax versions where the Mosaic kernel has run compiled.
  monkeypatch.setattr(api, "_jax_version", lambda: (0, 10))
  assert select_kernel(x, dy, w, st, ADAMW, None, **hopper) == "triton"
  monkeypatch.setattr(api, "_jax_version", lambda: (0, 11))
  # Under vmap (a batch of weights) the Mosaic op would copy W: Triton.
  picked = []
  def pick(w_):
    picked.append(select_kernel(x, dy, w_, st, ADAMW, None, **hopper))
    return w_
  jax.vmap(pick)(jnp.stack([w, w]))
  def pick_state(mu):  # only the states batched
    picked.append(select_kernel(x, dy, w, (mu, st[1]), ADAMW, None, **hopper))
    return mu
  jax.vmap(pick_state)(jnp.stack([st[0], st[0]]))
  assert picked == ["triton", "triton"]


def test_auto_runs_everywhere(rng):
  # 'auto' (and None) pick a kernel on a GPU and the reference elsewhere:
  # never a "needs a GPU" error, and the result is the reference's.
  x, dy, w, st, hp = _inputs(rng, 128, 64, 128, jnp.bfloat16)
  ref = fused_dw_update_reference(x, dy, w, st, hp, rule=ADAMW)
  for impl in ("auto", None):
    got = fused_dw_update(x, dy, w, st, hp, rule=ADAMW, implementation=impl)
    assert rel_err(got[0], ref[0]) < 1e-6
    assert rel_err(got[1][1], ref[1][1]) < 1e-5


def test_explicit_triton_never_falls_back(rng):
  args = _inputs(rng, 16, 16, 16, jnp.float32)
  if ON_GPU:
    ref = fused_dw_update_reference(*args, rule=ADAMW)
    got = fused_dw_update(*args, rule=ADAMW, implementation="triton")
    assert rel_err(got[0], ref[0]) < 1e-5
  else:
    with pytest.raises(RuntimeError, match="needs a GPU"):
      fused_dw_update(*args, rule=ADAMW, implementation="triton")


@pytest.mark.parametrize("change,match", [
    (lambda a: {**a, "x": a["x"][None]}, "x must be 2-D"),
    (lambda a: {**a, "dy": a["dy"][:3]}, "same number of tokens"),
    (lambda a: {**a, "w": a["w"].T}, "w must have shape"),
    (lambda a: {**a, "x": a["x"].astype(jnp.float16)}, "x.dtype=float16"),
    (lambda a: {**a, "dy": a["dy"].astype(jnp.bfloat16)}, "must match"),
    (lambda a: {**a, "w": a["w"].astype(jnp.float16)}, "w.dtype=float16"),
    (lambda a: {**a, "seed": jnp.uint32(3)}, "needs bfloat16 w"),
    (lambda a: {**a, "w": a["w"].astype(jnp.bfloat16), "seed": 1.5}, "seed must be an integer"),
    (lambda a: {**a, "state": a["state"][:1]}, "state must hold 2"),
    (lambda a: {**a, "state": (a["state"][0][:, :2], a["state"][1])}, "state 'mu'"),
    (lambda a: {**a, "hparams": a["hparams"][:3]}, "hparams must be float32"),
])
def test_bad_input_is_refused(rng, change, match):
  x, dy, w, state, hp = _inputs(rng, 8, 6, 5, jnp.float32)
  args = change(dict(x=x, dy=dy, w=w, state=state, hparams=hp))
  with pytest.raises(ValueError, match=match):
    fused_dw_update(**args, rule=ADAMW, implementation="xla")


@pytest.mark.parametrize("field,value", [("block_m", 24), ("block_t", 8),
                                         ("num_warps", 0)])
def test_bad_config_is_refused(field, value):
  with pytest.raises(ValueError, match=field):
    FusedDWConfig(**{field: value})


@pytest.mark.parametrize("dtype,w_dtype,seeded", [
    (jnp.float32, jnp.float32, False), (jnp.bfloat16, jnp.float32, False),
    (jnp.bfloat16, jnp.bfloat16, False), (jnp.bfloat16, jnp.bfloat16, True)])
def test_kernel_lowers_to_triton_with_aliased_outputs(dtype, w_dtype, seeded):
  """The compiled path's Triton IR builds here too (no GPU needed to lower)."""
  from pallas_kernels.fused_dw import kernel_triton

  def f(x, dy, w, mu, nu, hp, seed):
    return kernel_triton.fused_dw_update_triton(
        x, dy, w, (mu, nu), hp, rule=ADAMW,
        config=FusedDWConfig.default(300, 257, 130, dtype), interpret=False,
        seed=seed if seeded else None)

  sds = jax.ShapeDtypeStruct
  args = [sds((300, 257), dtype), sds((300, 130), dtype), sds((257, 130), w_dtype)]
  args += [sds((257, 130), jnp.float32)] * 2
  args += [sds((ADAMW.num_hyperparams,), jnp.float32), sds((), jnp.uint32)]
  text = lower_for_cuda(jax.jit(f, donate_argnums=(2, 3, 4)), *args).as_text()
  assert "__gpu$xla.gpu.triton" in text
  assert text.count("output_operand_aliases") >= 1


def test_repeated_triton_ops_lower_one_kernel(rng, monkeypatch):
  # One Triton kernel per static configuration, however many layers call it
  # (its lowering compiles it); lowered for CUDA on any machine.
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(api, "_require_gpu", lambda *a: None)
  x, dy, w, st, hp = _inputs(rng, 64, 64, 128, jnp.bfloat16)

  def layers(x, dy, ws, st, hp):
    new = []
    for v in ws:
      v, st = fused_dw_update(x, dy, v, st, hp, rule=ADAMW,
                              implementation="triton")
      new.append(v)
    return new, st

  text = lower_for_cuda(
      jax.jit(layers), x, dy, [w, w + 1, w + 2], st, hp).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  assert text.count("call @forge_fused_dw_update_triton") == 3


def test_an_unhashable_rule_still_runs(rng):
  # The kernels are shared per (hashable) static configuration; a user rule
  # that cannot be hashed runs unshared rather than failing.
  from forge_jax.rules import ElementwiseRule  # pylint: disable=g-import-not-at-top
  rule = ElementwiseRule(name="sgd_state", state_names=["m"],
                         hyperparam_names=("learning_rate",),
                         direction=lambda g, p, s, hp, c: (g, s))
  with pytest.raises(TypeError):
    hash(rule)
  x, dy, w, _, _ = _inputs(rng, 16, 16, 32, jnp.float32)
  st = (jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),)
  hp = rule.pack(dict(learning_rate=0.1), 1)
  got = fused_dw_update(x, dy, w, st, hp, rule=rule, implementation="triton",
                        interpret=True)
  want = fused_dw_update_reference(x, dy, w, st, hp, rule=rule)
  assert rel_err(got[0], want[0]) < 1e-6


@pytest.mark.parametrize("impl,interpret", BACKENDS)
@pytest.mark.parametrize("seed", [None, 1234])
def test_bf16_weights_match_the_reference(rng, impl, interpret, seed):
  """bf16 w: fp32 update, then rounding (stochastic with a seed)."""
  x, dy, w, state, hp = _inputs(rng, 70, 45, 33, jnp.bfloat16)
  w = w.astype(jnp.bfloat16)
  seed = None if seed is None else jnp.uint32(seed)
  ref_w, ref_state = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW, seed=seed)
  got_w, got_state = fused_dw_update(
      x, dy, w, state, hp, rule=ADAMW, implementation=impl, interpret=interpret,
      config=SMALL if interpret else None, seed=seed)
  assert got_w.dtype == jnp.bfloat16
  # Same random bits per element; the fp32 sums differ in order only, which
  # can move a value across a rounding boundary in rare elements.
  a, b = np.asarray(got_w, np.float32), np.asarray(ref_w, np.float32)
  ulp = np.abs(b) * 2.0**-7
  assert np.all(np.abs(a - b) <= ulp + 1e-30)
  assert np.mean(a != b) < 0.01
  for g, r in zip(got_state, ref_state):
    assert rel_err(g, r) < 1e-5


def test_stochastic_rounding_is_tile_independent(rng):
  x, dy, w, state, hp = _inputs(rng, 40, 64, 64, jnp.bfloat16)
  w = w.astype(jnp.bfloat16)
  outs = [fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                          interpret=True, seed=jnp.uint32(9),
                          config=FusedDWConfig(bm, bn, 16, 1, 4, 1))[0]
          for bm, bn in ((16, 16), (32, 64), (64, 32))]
  for o in outs[1:]:
    np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(outs[0], np.float32))


@pytest.mark.parametrize("transpose_x", [False, True])
@pytest.mark.parametrize("t,d_in,d_out", [
    (64, 32, 64),    # every axis divides by its block: the unmasked path
    (37, 45, 19),    # none does: masked loads and stores
])
def test_unmasked_path_and_transposed_x(rng, transpose_x, t, d_in, d_out):
  x, dy, w, state, hp = _inputs(rng, t, d_in, d_out, jnp.bfloat16)
  cfg = FusedDWConfig(16, 32, 16, 2, 4, 1, transpose_x=transpose_x)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True, config=cfg)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    assert bool(jnp.all(jnp.isfinite(a)))
    assert rel_err(a, b) <= _tol(jnp.bfloat16, t)


@pytest.mark.parametrize("d_out", [128, 100])
def test_unmasked_path_with_int8_state(rng, d_out):
  """int8 codes and scales on the unmasked path (128) and the masked one."""
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  x, dy, w, (mu, nu), hp = _inputs(rng, 32, 32, d_out, jnp.bfloat16)
  state = (quantization.quantize(mu, False), quantization.quantize(nu, True))
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True, config=FusedDWConfig(16, 64, 16, 2, 4, 1))
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
  for g, r in zip(got[1], ref[1]):
    np.testing.assert_array_equal(g.codes, r.codes)
    np.testing.assert_allclose(g.scale, r.scale, rtol=1e-5)


@pytest.mark.parametrize("prefetch", [1, 2, 3])
@pytest.mark.parametrize("int8", [False, True])
def test_prefetched_epilogue_tiles(rng, prefetch, int8):
  """W and states loaded before the token loop: the same result."""
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  x, dy, w, (mu, nu), hp = _inputs(rng, 37, 40, 100, jnp.bfloat16)
  state = ((quantization.quantize(mu, False), quantization.quantize(nu, True))
           if int8 else (mu, nu.astype(jnp.bfloat16)))
  cfg = FusedDWConfig(16, 64, 16, 2, 4, 1, prefetch=prefetch)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True, config=cfg)
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
  for g, r in zip(got[1], ref[1]):
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(r)):
      assert rel_err(a.astype(jnp.float32), b.astype(jnp.float32)) <= 1e-5


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("impl", ["xla", "triton"])
def test_sharded_update_rounds_like_the_whole(rng, axis, impl):
  """A W split in two shards, each updated with its index_offset, equals the
  whole W updated at once, bit for bit (stochastic rounding included)."""
  x, dy, w, state, hp = _inputs(rng, 24, 32, 64, jnp.bfloat16)
  w = w.astype(jnp.bfloat16)
  seed = jnp.uint32(77)
  kw = dict(rule=ADAMW, implementation=impl, interpret=True, seed=seed,
            config=SMALL if impl == "triton" else None)
  whole_w, whole_state = fused_dw_update(x, dy, w, state, hp, **kw)
  halves = []
  for k in range(2):
    sl = [slice(None), slice(None)]
    n = w.shape[axis] // 2
    sl[axis] = slice(k * n, (k + 1) * n)
    sl = tuple(sl)
    xs, dys = (x[:, sl[0]], dy) if axis == 0 else (x, dy[:, sl[1]])
    offset = (k * n, 0) if axis == 0 else (0, k * n)
    halves.append(fused_dw_update(xs, dys, w[sl], tuple(s[sl] for s in state), hp,
                                  index_offset=offset, index_width=w.shape[1], **kw))
  got_w = jnp.concatenate([h[0] for h in halves], axis)
  np.testing.assert_array_equal(np.asarray(got_w, np.float32),
                                np.asarray(whole_w, np.float32))
  for i, s in enumerate(whole_state):
    np.testing.assert_allclose(jnp.concatenate([h[1][i] for h in halves], axis), s,
                               rtol=2e-6, atol=1e-9)
  # Without the offset the shards would draw the other shard's bits.
  alone = fused_dw_update(x if axis else x[:, 16:], dy[:, 32:] if axis else dy,
                          w[:, 32:] if axis else w[16:],
                          tuple(s[:, 32:] if axis else s[16:] for s in state), hp, **kw)
  assert not np.array_equal(np.asarray(alone[0], np.float32),
                            np.asarray(halves[1][0], np.float32))


@pytest.mark.parametrize("kw,match", [
    (dict(index_offset=(0,)), "pair"),
    (dict(index_offset=(-1, 0)), r"\[0, 2\*\*32\)"),
    (dict(index_offset=(1.5, 0)), "integer scalars"),
    (dict(index_width=jnp.int32(100)), "Python int"),
    (dict(index_width=2**32), "below 2"),
])
def test_bad_index_offset_or_width_is_refused(rng, kw, match):
  x, dy, w, state, hp = _inputs(rng, 8, 16, 32, jnp.float32)
  with pytest.raises(ValueError, match=match):
    fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="xla", **kw)


def test_large_python_index_offset_is_accepted(rng):
  x, dy, w, state, hp = _inputs(rng, 8, 16, 32, jnp.bfloat16)
  w = w.astype(jnp.bfloat16)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True, config=SMALL, seed=jnp.uint32(1),
                        index_offset=(2**31, 0))
  want = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW,
                                   seed=jnp.uint32(1), index_offset=(2**31, 0))
  np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                np.asarray(want[0], np.float32))


@pytest.mark.parametrize("split,prefetch", [(2, 0), (4, 0), (2, 3)])
@pytest.mark.parametrize("mode", ["fp32", "bf16-sr", "int8"])
def test_epilogue_split_matches_reference(rng, split, prefetch, mode):
  """The tile accumulated and updated in column chunks: the same result as
  the reference, on a shape that no block divides (ragged last chunk)."""
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  x, dy, w, (mu, nu), hp = _inputs(rng, 37, 40, 300, jnp.bfloat16)
  seed = None
  state = (mu, nu)
  if mode == "int8":
    state = (quantization.quantize(mu, False), quantization.quantize(nu, True))
  elif mode == "bf16-sr":
    w, seed = w.astype(jnp.bfloat16), jnp.uint32(5)
  block_n = 64 * split if mode == "int8" else 32 * split
  cfg = FusedDWConfig(16, block_n, 16, 2, 4, 1, prefetch=prefetch,
                      epilogue_split=split)
  ref = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW, seed=seed)
  got = fused_dw_update(x, dy, w, state, hp, rule=ADAMW, implementation="triton",
                        interpret=True, config=cfg, seed=seed)
  if mode == "bf16-sr":  # same stochastic rounding of the same value
    assert np.mean(np.asarray(got[0] == ref[0])) > 0.999
  else:
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
  for g, r in zip(got[1], ref[1]):
    if mode == "int8":
      np.testing.assert_array_equal(g.codes, r.codes)
      np.testing.assert_allclose(g.scale, r.scale, rtol=1e-5)
    else:
      assert rel_err(g, r) <= 1e-5


def test_epilogue_split_checks():
  with pytest.raises(ValueError, match="epilogue_split=3 must be a power of two"):
    FusedDWConfig(16, 64, 16, epilogue_split=3)
  with pytest.raises(ValueError, match="block_n / epilogue_split >= 16"):
    FusedDWConfig(16, 64, 16, epilogue_split=8)
  assert FusedDWConfig(16, 128, 16, epilogue_split=4).chunk_n == 32
  from pallas_kernels import quantization  # pylint: disable=g-import-not-at-top
  x, dy = jnp.ones((8, 16), jnp.bfloat16), jnp.ones((8, 128), jnp.bfloat16)
  w = jnp.ones((16, 128))
  state = (quantization.quantize(w), quantization.quantize(w, True))
  with pytest.raises(ValueError, match=r"block_n / config.epilogue_split = 32 must "
                     "be a multiple of 64 .* with int8 state"):
    fused_dw_update(x, dy, w, state, ADAMW.pack(dict(
        learning_rate=1e-3, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0), 1),
                    rule=ADAMW, implementation="triton", interpret=True,
                    config=FusedDWConfig(16, 128, 16, epilogue_split=4))


@pytest.mark.parametrize("kwargs,match", [
    (dict(epilogue_split=2.0), "epilogue_split=2.0 must be an int"),
    (dict(epilogue_split=True), "epilogue_split=True must be an int"),
    (dict(transpose_x=1), "transpose_x=1 must be a bool"),
    (dict(block_m=64.0), "block_m=64.0 must be an int")])
def test_config_field_types(kwargs, match):
  with pytest.raises(ValueError, match=match):
    FusedDWConfig(**kwargs)
