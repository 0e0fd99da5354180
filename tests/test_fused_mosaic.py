"""The Mosaic GPU fused kernel (TMA + wgmma) against the unfused reference.

On the CPU the kernel runs in Mosaic GPU interpret mode (which simulates
shared memory, TMA copies and barriers); on a GPU also compiled.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ON_GPU, rel_err
from forge_jax import rules
from pallas_kernels import quantization
from pallas_kernels.fused_dw import MosaicConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference
from pallas_kernels.fused_dw import kernel_mosaic

INTERPRET = [True] + ([False] if ON_GPU else [])
ONE_SUB = MosaicConfig(block_m=64, block_n=64, block_t=64, max_concurrent_steps=2)
HYPERPARAMS = {"learning_rate": 3e-2, "b1": 0.9, "b2": 0.99, "eps": 1e-8,
               "threshold": 5.0, "weight_decay": 0.1, "decay": 0.9,
               "momentum": 0.9}


def _inputs(rng, rule, t, d_in, d_out, w_dtype=jnp.float32,
            state_dtype=jnp.float32, count=7):
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), w_dtype)
  state = []
  for name in rule.state_names:
    v = 0.1 * rng.standard_normal((d_in, d_out))
    if name in rule.nonnegative_states:
      v = v * v
    state.append(jnp.asarray(v, state_dtype))
  hp = rule.pack({n: HYPERPARAMS[n] for n in rule.hyperparam_names}, count)
  return x, dy, w, tuple(state), hp


def _run(args, rule, config, interpret):
  return jax.jit(lambda *a: fused_dw_update(
      *a, rule=rule, implementation="mosaic", config=config,
      interpret=interpret))(*args)


def _check(got, want, tol):
  for g, r in zip((got[0], *got[1]), (want[0], *want[1])):
    assert g.shape == r.shape and g.dtype == r.dtype
    assert bool(jnp.all(jnp.isfinite(g)))
    assert rel_err(g, r) <= tol, rel_err(g, r)


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("rule", [rules.ADAMW, rules.NADAMW, rules.RADAM,
                                  rules.LION, rules.RMSPROP, rules.ADAGRAD,
                                  rules.SGD, rules.SGD_MOMENTUM,
                                  rules.SGD_NESTEROV],
                         ids=lambda r: r.name)
def test_every_rule_matches_reference(rng, rule, interpret):
  args = _inputs(rng, rule, 64, 64, 128)
  want = fused_dw_update_reference(*args, rule=rule)
  _check(_run(args, rule, ONE_SUB, interpret), want, 2e-6)


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("count", [1, 7], ids=["first-step", "step-7"])
@pytest.mark.parametrize("scale", [1e-10, 1e-7], ids=["dW-below-eps", "dW-near-eps"])
@pytest.mark.parametrize("rule", [rules.ADAMW, rules.NADAMW, rules.RADAM,
                                  rules.RMSPROP, rules.ADAGRAD],
                         ids=lambda r: r.name)
def test_model_scale_gradients_match_reference(rng, rule, scale, count, interpret):
  # In a Llama step dW's elements are around eps (1e-8) and below: the loss
  # is a mean over the batch's tokens and the vocabulary. Where |dW| ~ eps
  # the update depends on dW's magnitude, not only its sign; from zero
  # moments (the first step) and from small ones.
  x, dy, w, st, hp = _inputs(rng, rule, 64, 64, 128, count=count)
  dy = (dy.astype(jnp.float32) * scale).astype(jnp.bfloat16)
  # Moments at dW's scale: a second moment (nonnegative) at its square.
  st = tuple(jnp.zeros_like(v) if count == 1 else
             v * scale**2 if n in rule.nonnegative_states else v * scale
             for v, n in zip(st, rule.state_names))
  args = (x, dy, w, st, hp)
  want = fused_dw_update_reference(*args, rule=rule)
  got = _run(args, rule, ONE_SUB, interpret)
  _check(got, want, 2e-6)
  # The step moved W (its size is not swamped by weight decay or rounding).
  assert float(jnp.max(jnp.abs(got[0] - w))) > 0


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("config", [
    MosaicConfig(block_m=128, block_n=128, block_t=64, max_concurrent_steps=3),
    MosaicConfig(block_m=128, block_n=128, block_t=64, epi_slots=3, epi_n=32),
    MosaicConfig(block_m=64, block_n=128, block_t=128, max_concurrent_steps=1,
                 early_epilogue=True, group_m=1),
    MosaicConfig(block_m=128, block_n=128, block_t=64, epi_slots=4,
                 epi_ahead=3, epi_n=16),
    MosaicConfig(block_m=64, block_n=128, block_t=64, epi_slots=3,
                 epi_ahead=1, epi_n=32),
], ids=["128x128x64-s3", "slots3-epi32", "early-epilogue", "slots4-ahead3",
        "slots3-ahead1"])
def test_tiles_and_epilogue_pipelines(rng, monkeypatch, config, interpret):
  # Several tiles in the grid (in 256 / block_m × out 256 / block_n), several
  # token steps, several epilogue sub-tiles per tile. In interpret mode with
  # the interpreter's race detection on: a slot's loads must not start while
  # its stores may still read it.
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks  # pylint: disable=g-import-not-at-top
  base = kernel_mosaic.interpret_params
  monkeypatch.setattr(kernel_mosaic, "interpret_params", lambda: dataclasses.replace(
      base(), detect_races=True))
  args = _inputs(rng, rules.ADAMW, 256, 256, 256)
  want = fused_dw_update_reference(*args, rule=rules.ADAMW)
  _check(_run(args, rules.ADAMW, config, interpret), want, 2e-6)
  if interpret:
    assert not gpu_callbacks.get_races().races_found


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("w_dtype,state_dtype", [
    (jnp.bfloat16, jnp.float32), (jnp.bfloat16, jnp.bfloat16),
    (jnp.float32, jnp.bfloat16)])
def test_bf16_storage_rounds_to_nearest(rng, w_dtype, state_dtype, interpret):
  args = _inputs(rng, rules.ADAMW, 64, 64, 64, w_dtype, state_dtype)
  want = fused_dw_update_reference(*args, rule=rules.ADAMW)
  got = _run(args, rules.ADAMW, ONE_SUB, interpret)
  # Same fp32 update, then one rounding to nearest: equal, except (rarely)
  # by one ulp where the fp32 values straddle a rounding boundary; stochastic
  # rounding or truncation would differ in about half of the elements.
  for g, r in zip((got[0], *got[1]), (want[0], *want[1])):
    assert g.dtype == r.dtype
    if g.dtype == jnp.float32:  # differs only by the matmul's summation order
      assert rel_err(g, r) <= 2e-6
      continue
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    assert np.mean(g == r) >= 0.99, np.mean(g == r)
    # ...and elsewhere by one ulp, at most |r|·2**-7 in bf16.
    assert np.all(np.abs(g - r) <= np.abs(r) * 2.0 ** -7 + 1e-30)


@pytest.mark.parametrize("interpret", INTERPRET)
def test_five_steps_match_the_unfused_loop(rng, interpret):
  rule = rules.ADAMW
  x, dy, w, state, _ = _inputs(rng, rule, 64, 64, 128)
  got = want = (w, state)
  for step in range(1, 6):
    x = jnp.asarray(rng.standard_normal(x.shape), jnp.bfloat16)
    hp = rule.pack({n: HYPERPARAMS[n] for n in rule.hyperparam_names}, step)
    got = _run((x, dy, *got, hp), rule, ONE_SUB, interpret)
    want = fused_dw_update_reference(x, dy, *want, hp, rule=rule)
  _check(got, want, 1e-5)


def test_scalar_equations_run_outside_the_kernel():
  # AdamW's bias corrections (pow of scalars, which Mosaic GPU cannot lower)
  # are hoisted; only per-element equations stay in the kernel.
  split = kernel_mosaic._split_rule(rules.ADAMW, (64, 64))
  hoisted = {e.primitive.name for e in split.hoisted}
  assert "pow" in hoisted
  assert all(o.aval.shape == (64, 64)
             for e in split.in_kernel for o in e.outvars)
  assert split.scalars  # the kernel reads some hoisted values
  hp = rules.ADAMW.pack({n: HYPERPARAMS[n] for n in
                         rules.ADAMW.hyperparam_names}, 3)
  scalars = kernel_mosaic.rule_scalars(rules.ADAMW, hp, (64, 64))
  assert scalars.shape == (len(split.scalars) + 1,)
  assert bool(jnp.all(jnp.isfinite(scalars)))


@pytest.mark.parametrize("rule,divisions", [
    (rules.ADAMW, 1), (rules.NADAMW, 1), (rules.RADAM, 1)])
def test_bias_corrections_are_hoisted_reciprocals(rule, divisions):
  # Stop 29: each element pays one division (the step's quotient); the bias
  # corrections are reciprocals of scalars, computed outside the kernel
  # (0.519 -> 0.500 ms on the H200 at 4096x14336, T=2048).
  split = kernel_mosaic._split_rule(rule, (64, 32))
  per_element = [e.primitive.name for e in split.in_kernel]
  assert per_element.count("div") == divisions, per_element
  assert "div" in {e.primitive.name for e in split.hoisted}


def test_sqrt_replacement_matches_sqrt(rng):
  # Used when a jax's Mosaic GPU has no sqrt lowering (0 stays 0).
  x = jnp.asarray(np.concatenate([[0.0, 1e-30, 1.0, 4.0, np.inf, -1.0, np.nan,
                                   3e38], rng.random(56) * 10]), jnp.float32)
  got = kernel_mosaic._sqrt_via_rsqrt(x)
  assert float(got[0]) == 0.0 and float(got[4]) == np.inf
  np.testing.assert_allclose(got, jnp.sqrt(x), rtol=1e-6)  # NaN where sqrt is


@pytest.mark.parametrize("change,match", [
    (dict(t=100), "must divide by block_t"),
    (dict(d_out=96), "must divide by block_t"),
    (dict(x_dtype=jnp.float32), "must be bfloat16"),
    (dict(int8=True, epi32=True), "int8 states need epi_n = 64"),
    (dict(fold=True), "fold block 4 must be at least 8"),
    (dict(fold0=True), "fold block 1 must be at least 8"),
    (dict(big_tile=True, t=128, d_in=128, d_out=256), "shared memory"),
    (dict(no_transpose=True), "interpreter"),
    (dict(ws_interpret=True, d_out=128), "not run in interpret mode"),
    (dict(t=0, int8=True, epi32=True), "int8"),  # refused even with T = 0
    (dict(triton_config=True), "needs a MosaicConfig"),
])
def test_out_of_scope_ops_are_refused(rng, change, match):
  from forge_jax._src.fold import FoldAdamRule  # pylint: disable=g-import-not-at-top
  from pallas_kernels.fused_dw import FusedDWConfig  # pylint: disable=g-import-not-at-top
  rule = (FoldAdamRule(2) if change.get("fold") else
          FoldAdamRule(0) if change.get("fold0") else rules.ADAMW)
  t, d_out = change.get("t", 64), change.get("d_out", 64)
  x, dy, w, state, hp = _inputs(rng, rules.ADAMW, t, change.get("d_in", 64),
                                d_out, w_dtype=jnp.bfloat16)
  if change.get("x_dtype"):
    x, dy = x.astype(jnp.float32), dy.astype(jnp.float32)
  if change.get("int8"):
    state = (quantization.quantize(state[0].astype(jnp.float32), False),
             quantization.quantize(state[1].astype(jnp.float32), True))
  if change.get("fold") or change.get("fold0"):
    state = tuple(jnp.zeros(rule.state_shape(w.shape), jnp.float32)
                  for _ in rule.state_names)
    hp = rule.pack({n: HYPERPARAMS.get(n, 0.25) for n in rule.hyperparam_names}, 1)
  config = (FusedDWConfig() if change.get("triton_config") else
            MosaicConfig(block_m=128, block_n=256, block_t=128,
                         max_concurrent_steps=4)
            if change.get("big_tile") else
            MosaicConfig(block_m=64, block_n=64, transpose_x=False)
            if change.get("no_transpose") else
            MosaicConfig(block_m=64, block_n=64, epi_n=32, compute_wgs=2)
            if change.get("ws_interpret") else
            MosaicConfig(block_m=64, block_n=64, epi_n=32)
            if change.get("epi32") else ONE_SUB)
  with pytest.raises(ValueError, match=match):
    fused_dw_update(x, dy, w, state, hp, rule=rule, implementation="mosaic",
                    config=config, interpret=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_m=32), "block_m"), (dict(block_n=96), "block_n"),
    (dict(block_t=32), "block_t"), (dict(epi_slots=5), "epi_slots"),
    (dict(epi_ahead=3), "epi_ahead=3 must be in"), (dict(epi_ahead=0), "epi_ahead"),
    (dict(epi_m=32), "epilogue sub-tile"),
    (dict(max_concurrent_steps=0), "max_concurrent_steps=0 must be >= 1"),
    (dict(group_m=0), "group_m=0 must be >= 1"),
    (dict(compute_wgs=3), "compute_wgs"), (dict(num_ctas=0), "num_ctas"),
    (dict(num_ctas=4), "num_ctas=4 needs compute_wgs=2"),
    (dict(ping_pong=True), "ping_pong=True needs compute_wgs=2"),
    (dict(ping_pong=1, compute_wgs=2), "ping_pong=1 must be a bool"),
    (dict(ping_pong=True, compute_wgs=2, max_concurrent_steps=1),
     "max_concurrent_steps >= 2"),
])
def test_config_validation(kwargs, match):
  with pytest.raises(ValueError, match=match):
    MosaicConfig(**kwargs)


def test_default_config_fits_64_multiples(rng):
  assert MosaicConfig.default(2048, 4096, 14336) == MosaicConfig()
  assert MosaicConfig.default(512, 4096, 14336) == MosaicConfig(transpose_x=False)
  # The interpreter has no transposed views: the default always transposes.
  assert MosaicConfig.default(512, 4096, 14336, interpret=True).transpose_x
  # x through the transposed view for narrow W (out <= 1024) at every T,
  # transposed by XLA from T=2048 on otherwise.
  for t in (512, 2048, 8192):
    for narrow in (False, True):
      for d_in in (4096, 5120):  # 256 and 320 tiles of 128×128: < 4 per SM
        assert MosaicConfig.default(t, d_in, 1024, narrow=narrow) == MosaicConfig(
            transpose_x=False)  # one warpgroup, through the view
      assert MosaicConfig.default(t, 4096, 1024, narrow=narrow,
                                  interpret=True).transpose_x
    # With four tiles per multiprocessor (14336→1024: 896) ping-pong as before.
    assert MosaicConfig.default(t, 14336, 1024, narrow=True).compute_wgs == (
        2 if t >= 2048 else 1)
    assert MosaicConfig.default(t, 14336, 1024).compute_wgs == (
        2 if t >= 8192 else 1)
  assert MosaicConfig.default(2048, 4096, 2048).transpose_x
  cfg = MosaicConfig.default(64, 192, 64)
  assert (cfg.block_m, cfg.block_n) == (64, 64)
  # Ping-pong where it measured faster (fp32 and int8 states from T=8192 on,
  # bf16 W and states from T=2048 on) and there are two tiles per
  # multiprocessor; never in interpret mode or where the tile does not divide.
  pp = lambda c: (c.compute_wgs, c.ping_pong)  # noqa: E731
  # bf16 ping-pong: 64x32 epilogue sub-tiles from T=2048 on (stop 28), x
  # through the transposed view below T=4096 (measured at T=2048), transposed
  # by XLA from there on (slower at T=8192; stop 32).
  for t, view in ((2048, True), (3072, True), (4096, False)):
    assert MosaicConfig.default(t, 4096, 14336, narrow=True) == MosaicConfig(
        max_concurrent_steps=4, epi_n=32, compute_wgs=2, ping_pong=True,
        transpose_x=not view)
  assert MosaicConfig.default(8192, 4096, 14336, narrow=True) == MosaicConfig(
      max_concurrent_steps=5, epi_n=32, compute_wgs=2, ping_pong=True)
  for t, fp32, bf16, int8 in ((512, 1, 1, 1), (2048, 1, 2, 1), (8192, 2, 2, 2)):
    assert MosaicConfig.default(t, 4096, 14336).compute_wgs == fp32
    assert MosaicConfig.default(t, 4096, 14336, narrow=True).compute_wgs == bf16
    q = MosaicConfig.default(t, 4096, 14336, int8_states=True)
    assert (q.block_m, q.block_n, q.epi_n, q.compute_wgs) == (64, 128, 64, int8)
    for kw in (dict(interpret=True), dict(warp_specialized=False)):
      for narrow in (False, True):
        assert MosaicConfig.default(t, 4096, 14336, narrow=narrow,
                                    **kw).compute_wgs == 1
      q = MosaicConfig.default(t, 4096, 14336, int8_states=True, **kw)
      assert (q.block_m, q.block_n, q.compute_wgs) == (64, 128, 1)
  assert pp(MosaicConfig.default(8192, 4096, 14336)) == (2, True)
  assert MosaicConfig.default(8192, 4096, 14400, narrow=True).compute_wgs == 1
  # 2 · 132 tiles of 128×128 at least: 4096×1024 (Llama-3.1-8B's k and v
  # projections) has 256, 4096×1152 has 288.
  assert MosaicConfig.default(8192, 4096, 1024, narrow=True).compute_wgs == 1
  assert MosaicConfig.default(8192, 4096, 1152, narrow=True).compute_wgs == 2
  assert MosaicConfig.default(512, 4096, 192, int8_states=True).block_n == 64
  args = _inputs(rng, rules.ADAMW, 64, 192, 64)
  got = jax.jit(lambda *a: fused_dw_update(
      *a, rule=rules.ADAMW, implementation="mosaic", interpret=True))(*args)
  _check(got, fused_dw_update_reference(*args, rule=rules.ADAMW), 2e-6)


def test_replacements_reach_inside_nested_jits(rng):
  # RAdam's switch is a jnp.where (a nested jit) with a scalar predicate:
  # the kernel replays it with the predicate broadcast (Mosaic GPU has no
  # implicit broadcast), inlined from the nested jaxpr.
  split = kernel_mosaic._split_rule(rules.RADAM, (64, 64))
  seen = []
  replace = {jax.lax.select_n_p: lambda *a, **p: seen.append(1)
             or kernel_mosaic._select_n_broadcast(*a, **p)}
  args = _inputs(rng, rules.RADAM, 1, 64, 64)
  grad = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
  scalars = kernel_mosaic.rule_scalars(rules.RADAM, args[-1], (64, 64))
  got = kernel_mosaic._rule_in_kernel(split, scalars, grad, args[2], args[3],
                                      replace=replace)
  assert seen
  got = (got[0], *got[1])
  hp, count = rules.RADAM.unpack(args[-1])
  want = rules.RADAM.update(grad, args[2], args[3], hp, count)
  for g, r in zip(got, (want[0], *want[1])):
    np.testing.assert_allclose(g, r, rtol=1e-6)


# The warp-specialized layout: CPU interpret mode deadlocked intermittently
# on it (about one run in four, in the interpreter's simulated threads; the
# op now refuses it there), so its numbers are checked compiled on a GPU and
# the CPU checks its lowering.
WS_CONFIGS = [
    # 3 CTAs over 4 tiles of (64, 128): uneven shares; 2 sub-tiles per tile.
    MosaicConfig(block_m=64, block_n=64, block_t=64, max_concurrent_steps=2,
                 epi_n=32, compute_wgs=2, num_ctas=3),
    # 2 CTAs over 2 tiles of (128, 128); 8 epilogue sub-tiles per warpgroup.
    MosaicConfig(block_m=128, block_n=64, block_t=64, max_concurrent_steps=2,
                 epi_n=16, compute_wgs=2, num_ctas=2),
]


@pytest.mark.skipif(not ON_GPU, reason="compiled kernel: needs a GPU (the "
                    "CPU test below checks the lowering)")
@pytest.mark.parametrize("config", WS_CONFIGS, ids=["uneven", "8-subtiles"])
@pytest.mark.parametrize("rule,state_dtype", [
    (rules.LION, jnp.float32), (rules.ADAMW, jnp.float32),
    (rules.ADAMW, jnp.bfloat16)], ids=["lion-fp32", "adamw-fp32", "adamw-bf16"])
def test_warp_specialized_kernel(rng, rule, state_dtype, config):
  args = _inputs(rng, rule, 128, 128, 256, state_dtype=state_dtype)
  want = fused_dw_update_reference(*args, rule=rule)
  _check(_run(args, rule, config, False), want,
         2e-6 if state_dtype == jnp.float32 else 2 ** -8)


@pytest.mark.parametrize("config", WS_CONFIGS, ids=["uneven", "8-subtiles"])
def test_warp_specialized_kernel_lowers_for_cuda(rng, config):
  # Lowered for CUDA on any machine: the Mosaic GPU module is built (layouts,
  # shared-memory allocation, barriers), as on the H200.
  args = _inputs(rng, rules.ADAMW, 128, 128, 256)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=config, interpret=False))
  text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


# The ping-pong layout (compute_wgs=2, ping_pong=True): GPU-only like the
# warp-specialized one; the CPU checks its lowering.
PP_CONFIGS = [
    # 3 CTAs over 10 tiles of (64, 64): 4, 3 and 3 tiles, so one compute
    # warpgroup has a single tile; 2 token steps per tile against a ring of
    # 3 stages, so a tile's steps start at a different stage each time.
    MosaicConfig(block_m=64, block_n=64, block_t=64, max_concurrent_steps=3,
                 epi_n=32, compute_wgs=2, ping_pong=True, num_ctas=3),
    # 2 CTAs over 8 tiles of (128, 128), x through a transposed view, 16
    # epilogue sub-tiles per tile, 3 of them loading at a time, 4 stages.
    MosaicConfig(block_m=128, block_n=128, block_t=64, max_concurrent_steps=4,
                 epi_n=16, epi_slots=3, epi_ahead=3, compute_wgs=2,
                 ping_pong=True, transpose_x=False, num_ctas=2),
]
PP_SHAPES = [(128, 128, 320), (256, 256, 512)]  # (T, in, out) per config


@pytest.mark.skipif(not ON_GPU, reason="compiled kernel: needs a GPU (the "
                    "CPU test below checks the lowering)")
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("which", [0, 1], ids=["uneven", "noT-16-subtiles"])
@pytest.mark.parametrize("rule,state_dtype", [
    (rules.LION, jnp.float32), (rules.ADAMW, jnp.float32),
    (rules.ADAMW, jnp.bfloat16)], ids=["lion-fp32", "adamw-fp32", "adamw-bf16"])
def test_ping_pong_kernel(rng, rule, state_dtype, which, in_place):
  args = _inputs(rng, rule, *PP_SHAPES[which], state_dtype=state_dtype)
  want = fused_dw_update_reference(*args, rule=rule)
  got = jax.jit(lambda *a: fused_dw_update(
      *a, rule=rule, implementation="mosaic", config=PP_CONFIGS[which],
      in_place=in_place), donate_argnums=(2, 3))(*args)
  _check(got, want, 2e-6 if state_dtype == jnp.float32 else 2 ** -8)


@pytest.mark.skipif(not ON_GPU, reason="compiled kernel: needs a GPU (the "
                    "CPU test below checks the lowering)")
@pytest.mark.parametrize("rule", [rules.NADAMW, rules.RADAM, rules.RMSPROP,
                                  rules.ADAGRAD, rules.SGD, rules.SGD_MOMENTUM,
                                  rules.SGD_NESTEROV], ids=lambda r: r.name)
def test_ping_pong_every_rule(rng, rule):
  # The defaults take ping-pong for bf16 W and states whatever the rule; SGD
  # has no state at all (one array in the epilogue).
  args = _inputs(rng, rule, *PP_SHAPES[0])
  want = fused_dw_update_reference(*args, rule=rule)
  _check(_run(args, rule, PP_CONFIGS[0], False), want, 2e-6)


@pytest.mark.skipif(not ON_GPU, reason="compiled kernel: needs a GPU (the "
                    "CPU test below checks the lowering)")
@pytest.mark.parametrize("which", [0, 1], ids=["uneven", "noT-16-subtiles"])
def test_ping_pong_int8_states_and_stochastic_rounding(rng, which):
  config = dataclasses.replace(PP_CONFIGS[which], epi_n=64, epi_slots=2,
                               epi_ahead=2)  # int8: 64-column sub-tiles
  args = _inputs(rng, rules.ADAMW, *PP_SHAPES[which], w_dtype=jnp.bfloat16)
  args = (*args[:3], _quantized(rules.ADAMW, args[3]), args[4])
  kw = dict(rule=rules.ADAMW, seed=jnp.uint32(5), index_offset=(7, 3),
            index_width=700)
  got = _run_kw(args, config, kw)
  want = fused_dw_update_reference(*args, **kw)
  assert np.mean(np.asarray(got[0] == want[0])) >= 0.999
  _check_int8((got[0].astype(jnp.float32), got[1]),
              (want[0].astype(jnp.float32), want[1]), 2 ** -8)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("which", [0, 1], ids=["uneven", "noT-16-subtiles"])
def test_ping_pong_kernel_lowers_for_cuda(rng, which, in_place):
  args = _inputs(rng, rules.ADAMW, *PP_SHAPES[which])
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=PP_CONFIGS[which], interpret=False,
      in_place=in_place))
  text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  call = text[text.index("custom_call @mosaic_gpu"):].split("\n")[0]
  assert ("output_operand_aliases" in call) == in_place


def test_ping_pong_tiles_and_refusals(rng):
  # Its tiles are (block_m, block_n), not the cooperative layout's
  # (block_m, 2·block_n): out = 320 divides by 64 but not by 128.
  sds = jax.ShapeDtypeStruct
  x, dy = sds((128, 128), jnp.bfloat16), sds((128, 320), jnp.bfloat16)
  w = sds((128, 320), jnp.float32)
  st = (w, w)
  pp = PP_CONFIGS[0]
  assert kernel_mosaic.unsupported_reason(x, dy, w, st, rules.ADAMW, None,
                                          pp) is None
  coop = dataclasses.replace(pp, ping_pong=False)
  assert "block_n·compute_wgs = 64, 64, 128" in kernel_mosaic.unsupported_reason(
      x, dy, w, st, rules.ADAMW, None, coop)
  odd = sds((128, 330), jnp.float32)
  assert "block_n = 64, 64, 64" in kernel_mosaic.unsupported_reason(
      x, sds((128, 330), jnp.bfloat16), odd, (odd, odd), rules.ADAMW, None, pp)
  # Each compute warpgroup keeps its own epilogue buffers beside the ring:
  # 128×128 tiles with fp32 W and moments need epi_n = 32 to fit.
  big = MosaicConfig(compute_wgs=2, ping_pong=True)
  reason = kernel_mosaic.unsupported_reason(
      sds((2048, 4096), jnp.bfloat16), sds((2048, 14336), jnp.bfloat16),
      sds((4096, 14336), jnp.float32), (sds((4096, 14336), jnp.float32),) * 2,
      rules.ADAMW, None, big)
  assert reason and "shared memory" in reason
  assert kernel_mosaic.unsupported_reason(
      sds((2048, 4096), jnp.bfloat16), sds((2048, 14336), jnp.bfloat16),
      sds((4096, 14336), jnp.float32), (sds((4096, 14336), jnp.float32),) * 2,
      rules.ADAMW, None, dataclasses.replace(big, epi_n=32)) is None
  with pytest.raises(ValueError, match="interpret"):
    fused_dw_update(*_inputs(rng, rules.ADAMW, 128, 128, 320),
                    rule=rules.ADAMW, implementation="mosaic", config=pp,
                    interpret=True)


@pytest.mark.parametrize("ping_pong", [False, True])
def test_barriers_beyond_one_allocation_are_refused(rng, monkeypatch, ping_pong):
  # Two compute warpgroups × 4 epilogue slots × 5 arrays (W, two int8 codes,
  # two scale rows) = 40 barriers: Mosaic GPU initializes at most 32 at once.
  # Refused before lowering; without the refusal the lowering fails.
  config = MosaicConfig(block_m=64, block_n=128, max_concurrent_steps=2,
                        epi_slots=4, epi_ahead=3, compute_wgs=2,
                        ping_pong=ping_pong, num_ctas=2)
  args = _inputs(rng, rules.ADAMW, 512, 256, 512, w_dtype=jnp.bfloat16)
  args = (*args[:3], _quantized(rules.ADAMW, args[3]), args[4])
  reason = kernel_mosaic.unsupported_reason(*args[:4], rules.ADAMW, None, config)
  assert reason and "40 barriers" in reason
  assert kernel_mosaic.unsupported_reason(
      *args[:4], rules.ADAMW, None,
      dataclasses.replace(config, epi_slots=3)) is None
  monkeypatch.setattr(kernel_mosaic, "MAX_BARRIERS", 64)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=config, interpret=False))
  with pytest.raises(Exception, match="32 barriers"):
    fn.trace(*args).lower(lowering_platforms=("cuda",))


def test_folded_moments_keep_the_larger_shared_memory_slack(monkeypatch):
  # With folded moments and two compute warpgroups Mosaic GPU adds reduction
  # scratch: this tile's buffers count 231,424 bytes, and it needs 233,760
  # (jax 0.11.2); the estimate refuses it. With the 1 KiB slack of plain
  # tiles it would pass, and the lowering would fail.
  from forge_jax._src.fold import FoldAdamRule  # pylint: disable=g-import-not-at-top
  rule = FoldAdamRule(5)
  sds = jax.ShapeDtypeStruct
  t, d_in, d_out = 1024, 256, 512
  x, dy = sds((t, d_in), jnp.bfloat16), sds((t, d_out), jnp.bfloat16)
  w = sds((d_in, d_out), jnp.float32)
  st = tuple(sds(rule.state_shape(w.shape), jnp.float32) for _ in rule.state_names)
  config = MosaicConfig(block_m=64, block_n=128, max_concurrent_steps=8,
                        epi_n=32, compute_wgs=2, ping_pong=True)
  arrays = [jnp.float32] * 3
  folded = lambda: kernel_mosaic.smem_bytes(config, arrays, fold_block=32)  # noqa: E731
  assert folded() > kernel_mosaic.SMEM_BYTES
  lowers = kernel_mosaic._lowers(jax.lax.concatenate_p)
  if lowers:  # jax 0.10's Mosaic GPU cannot lower the folded epilogue at all
    reason = kernel_mosaic.unsupported_reason(x, dy, w, st, rule, None, config)
    assert reason and "shared memory" in reason
  monkeypatch.setattr(kernel_mosaic, "SMEM_SLACK", kernel_mosaic.SMEM_SLACK_TILES)
  assert folded() <= kernel_mosaic.SMEM_BYTES
  if not lowers:
    return
  assert kernel_mosaic.unsupported_reason(x, dy, w, st, rule, None, config) is None
  hp = jax.eval_shape(lambda: rule.pack(
      {n: 0.1 for n in rule.hyperparam_names}, 1))
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rule, config=config, interpret=False))
  with pytest.raises(Exception, match="shared memory"):
    fn.trace(x, dy, w, st, hp).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("config", [MosaicConfig(), WS_CONFIGS[1]],
                         ids=["one-warpgroup", "warp-specialized"])
def test_compiled_kernel_updates_in_place(rng, config):
  # Lowered for CUDA (on any machine): W and both moments are aliased from
  # the custom call's operands to its results, so a caller that donates them
  # gets no copy (returning fresh buffers cost 0.35 ms at 4096x14336).
  args = _inputs(rng, rules.ADAMW, 128, 128, 256)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=config, interpret=False, in_place=True),
               donate_argnums=(2, 3))
  text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  call = text[text.index("custom_call @mosaic_gpu"):]
  aliases = call[call.index("output_operand_aliases"):].split("result_layouts")[0]
  # Operands: xT, dy, scalars, then W, mu, nu (indices 3, 4, 5).
  for i in (3, 4, 5):
    assert f"operand_index = {i}" in aliases, aliases


def test_kernel_writes_fresh_outputs_unless_asked_in_place(rng, monkeypatch):
  # in_place=False (the default): no operand aliased to a result, so XLA's
  # dynamic-slice fusion cannot give the two different addresses (the
  # in-place kernel then read garbage on the H200, docs/results.md stop 22).
  args = _inputs(rng, rules.ADAMW, 128, 128, 256)
  op = lambda *a: kernel_mosaic.fused_dw_update_mosaic(  # noqa: E731
      *a, rule=rules.ADAMW, config=MosaicConfig(), interpret=False)
  text = jax.jit(op, donate_argnums=(2, 3)).trace(*args).lower(
      lowering_platforms=("cuda",)).as_text()
  call_text = text[text.index("custom_call @mosaic_gpu"):].split("\n")[0]
  assert "mosaic_gpu" in call_text and "output_operand_aliases" not in call_text
  # fused_dw_update passes its in_place on (default False) and checks it.
  seen = []
  kernel = kernel_mosaic.fused_dw_update_mosaic
  monkeypatch.setattr(kernel_mosaic, "fused_dw_update_mosaic",
                      lambda *a, **kw: seen.append(kw["in_place"]) or kernel(*a, **kw))
  for kw in ({}, {"in_place": True}):
    fused_dw_update(*args, rule=rules.ADAMW, implementation="mosaic",
                    interpret=True, config=ONE_SUB, **kw)
  assert seen == [False, True]
  for bad in (1, None):
    with pytest.raises(ValueError, match=f"in_place={bad} must be True or False"):
      fused_dw_update(*args, rule=rules.ADAMW, implementation="mosaic", in_place=bad)
    with pytest.raises(ValueError, match=f"in_place={bad} must be True or False"):
      kernel(*args, rule=rules.ADAMW, config=ONE_SUB, interpret=True, in_place=bad)


@pytest.mark.skipif(not ON_GPU, reason="the hazard is XLA's GPU dynamic-slice "
                    "fusion of the compiled kernel")
@pytest.mark.parametrize("in_place", [False, True])
def test_in_place_kernel_under_scan_collecting_new_weights(rng, in_place):
  # lax.scan reads layer i's W from one stack and collects the new W into
  # another: right with fresh outputs; the in-place kernel gave garbage there
  # on the H200 (jax 0.11.2), which is why in_place defaults to False.
  layers = [_inputs(rng, rules.ADAMW, 512, 256, 512) for _ in range(3)]
  stack = lambda i: jnp.stack([a[i] for a in layers])  # noqa: E731
  x, dy, w = stack(0), stack(1), stack(2)
  mu, nu = (jnp.stack([a[3][k] for a in layers]) for k in range(2))
  hp = layers[0][4]

  def run(impl, **kw):
    def body(c, xs):
      nw, (nm, nn) = fused_dw_update(xs[0], xs[1], xs[2], xs[3:], hp,
                                     rule=rules.ADAMW, implementation=impl, **kw)
      return c, (nw, nm, nn)
    return jax.jit(lambda *a: jax.lax.scan(body, 0, a)[1])(x, dy, w, mu, nu)

  got, want = run("mosaic", in_place=in_place), run("xla")
  errs = [rel_err(g, r) for g, r in zip(got, want)]
  if in_place:  # a canary: when this fails, XLA handles the aliasing and the
    # default (and ForgeDense's choice, dense.update_in_place) can be revisited
    assert max(errs) > 1e-3, errs
  else:
    assert max(errs) <= 1e-5, errs


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("index_offset,index_width", [((0, 0), None), ((5, 9), 300)])
def test_stochastic_rounding_matches_reference(rng, interpret, index_offset,
                                               index_width):
  # bf16 W rounded stochastically: the same bits as the reference (the hash of
  # seed, count and the global element index, shard offsets included).
  args = _inputs(rng, rules.ADAMW, 64, 128, 128, w_dtype=jnp.bfloat16)
  kw = dict(rule=rules.ADAMW, seed=jnp.uint32(77), index_offset=index_offset,
            index_width=index_width)
  got = jax.jit(lambda *a: fused_dw_update(
      *a, implementation="mosaic", config=MosaicConfig(64, 64, 64, 2),
      interpret=interpret, **kw))(*args)
  want = jax.jit(lambda *a: fused_dw_update_reference(*a, **kw))(*args)
  nearest = fused_dw_update_reference(*args, rule=rules.ADAMW)
  if interpret:  # the same fp32 arithmetic as the jitted reference: bitwise
    np.testing.assert_array_equal(np.asarray(got[0], np.float32),
                                  np.asarray(want[0], np.float32))
  else:  # equal but where the fp32 value before rounding differs by an ulp
    assert np.mean(np.asarray(got[0] == want[0])) >= 0.999
  assert np.mean(np.asarray(got[0] == nearest[0])) < 0.9  # it did round randomly
  _check((got[0].astype(jnp.float32), got[1]),
         (want[0].astype(jnp.float32), want[1]), 2 ** -8)


@pytest.mark.skipif(not ON_GPU, reason="compiled warp-specialized kernel: "
                    "needs a GPU (its lowering is checked on the CPU below)")
@pytest.mark.parametrize("config", WS_CONFIGS, ids=["uneven", "8-subtiles"])
def test_warp_specialized_stochastic_rounding(rng, config):
  args = _inputs(rng, rules.ADAMW, 128, 256, 512, w_dtype=jnp.bfloat16)
  kw = dict(rule=rules.ADAMW, seed=jnp.uint32(77), index_offset=(3, 11),
            index_width=600)
  got = _run_kw(args, config, kw)
  want = fused_dw_update_reference(*args, **kw)
  assert np.mean(np.asarray(got[0] == want[0])) >= 0.999


def _run_kw(args, config, kw):
  return jax.jit(lambda *a: fused_dw_update(
      *a, implementation="mosaic", config=config, interpret=False, **kw))(*args)


@pytest.mark.parametrize("config", [MosaicConfig(), WS_CONFIGS[1]],
                         ids=["one-warpgroup", "warp-specialized"])
def test_stochastic_rounding_lowers_for_cuda(rng, config):
  args = _inputs(rng, rules.ADAMW, 128, 128, 256, w_dtype=jnp.bfloat16)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=config, interpret=False, seed=jnp.uint32(3)))
  assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_vmapped_op_matches_reference_and_lowers(rng):
  # A batch of independent weights (an nn.vmap ensemble): interpret mode
  # equals the reference per member (through the same custom_vmap rule as
  # the compiled op: fresh buffers, since pl.kernel batches Ref operands only
  # with a batch of 1), and the compiled op lowers for CUDA.
  args = [_inputs(rng, rules.ADAMW, 64, 64, 128) for _ in range(2)]
  x, dy, hp = args[0][0], args[0][1], args[0][4]
  ws = jnp.stack([a[2] for a in args])
  states = tuple(jnp.stack([a[3][i] for a in args]) for i in range(2))

  def op(interpret):
    return jax.vmap(lambda w, s: fused_dw_update(
        x, dy, w, s, hp, rule=rules.ADAMW, implementation="mosaic",
        config=ONE_SUB, interpret=interpret))

  got = jax.jit(op(True))(ws, states)
  for k in range(2):
    want = fused_dw_update_reference(x, dy, ws[k], tuple(s[k] for s in states), hp,
                                     rule=rules.ADAMW)
    _check((got[0][k], tuple(s[k] for s in got[1])), want, 2e-6)
  fn = jax.jit(lambda w, s: jax.vmap(lambda w_, s_: kernel_mosaic.fused_dw_update_mosaic(
      x, dy, w_, s_, hp, rule=rules.ADAMW, config=ONE_SUB, interpret=False))(w, s))
  text = fn.trace(ws, states).lower(lowering_platforms=("cuda",)).as_text()
  assert "custom_call @mosaic_gpu" in text


def test_hyperparameter_only_equations_inside_nested_jits_are_hoisted(rng):
  # A rule whose bias correction sits in a jitted helper: its pow (which
  # Mosaic GPU cannot lower) must still run outside the kernel.
  @jax.jit
  def corrected(m, b, c):
    return m / (1 - b ** c)

  def direction(grad, param, state, hp, count):
    del param
    (mu,) = state
    mu = hp["b1"] * mu + (1 - hp["b1"]) * grad
    return corrected(mu, hp["b1"], count), (mu,)

  rule = rules.ElementwiseRule("nested", ("mu",), ("learning_rate", "b1"),
                               direction)
  split = kernel_mosaic._split_rule(rule, (64, 64))
  assert "pow" in {e.primitive.name for e in split.hoisted}
  assert "pow" not in {e.primitive.name for e in split.in_kernel}
  args = _inputs(rng, rule, 64, 64, 64)
  _check(_run(args, rule, ONE_SUB, True),
         fused_dw_update_reference(*args, rule=rule), 2e-6)


def test_integer_scalars_reach_the_kernel_exactly(rng):
  # A per-step uint32 key (beyond fp32's 24-bit integers) used per element:
  # its low 23 bits become the mantissa of the direction (1.0 before), so a
  # key rounded through fp32 would change the result.
  def direction(grad, param, state, hp, count):
    del param, state
    key = count.astype(jnp.uint32) * jnp.uint32(2654435761)
    one = jax.lax.bitcast_convert_type(grad * 0.0 + 1.0, jnp.uint32)
    # The whole key enters the per-element XOR (masked only afterwards).
    bits = ((one ^ key) & jnp.uint32(0x7FFFFF)) | jnp.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type(bits, jnp.float32), ()

  rule = rules.ElementwiseRule("keyed", (), ("learning_rate",), direction)
  x, dy, w, state, _ = _inputs(rng, rule, 64, 64, 64)
  args = (x, dy, w, state, rule.pack({"learning_rate": 1.0}, 12345))
  got = _run(args, rule, ONE_SUB, True)
  want = fused_dw_update_reference(*args, rule=rule)
  # Equal up to the rounding of w - direction (|w - direction| < 8); a key
  # rounded to fp32 would move the direction by about 1.3e-5.
  np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-6)
  # Compiled, the key must lower too (Mosaic GPU lowers no scalar bitcast:
  # integers travel as two 16-bit halves).
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rule, config=ONE_SUB, interpret=False))
  assert "mosaic_gpu" in fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_signed_integer_scalars_reach_the_kernel_exactly(rng):
  # A negative int32 hyperparameter-only value (its sign bit set) used per
  # element must arrive bit for bit.
  def direction(grad, param, state, hp, count):
    del param, state
    key = -(count.astype(jnp.int32) * 1000003)  # < 0
    d = (grad * 0.0).astype(jnp.int32) ^ key  # per element
    return ((d & 0x7FFF).astype(jnp.float32)
            + jnp.where(d < 0, 0.5, 0.0).astype(jnp.float32)), ()

  rule = rules.ElementwiseRule("signed", (), ("learning_rate",), direction)
  x, dy, w, state, _ = _inputs(rng, rule, 64, 64, 64)
  args = (x, dy, w, state, rule.pack({"learning_rate": 1e-3}, 4321))
  split = kernel_mosaic._split_rule(rule, (64, 64))
  assert any(v.aval.dtype == jnp.int32 for v in split.scalars)
  got = _run(args, rule, ONE_SUB, True)
  want = fused_dw_update_reference(*args, rule=rule)
  # Up to rounding (|w| < 40); a lost sign or low bit moves W by >= 5e-4.
  np.testing.assert_allclose(got[0], want[0], rtol=0, atol=2e-5)


def test_shared_memory_estimate_matches_the_lowering(rng, monkeypatch):
  # The estimate refuses what Mosaic GPU's lowering refuses (the default tile
  # with two compute warpgroups) and accepts what it lowers.
  args = _inputs(rng, rules.ADAMW, 128, 128, 256)
  too_big = MosaicConfig(compute_wgs=2)
  assert kernel_mosaic.smem_bytes(too_big, [jnp.float32] * 3) > kernel_mosaic.SMEM_BYTES
  assert "shared memory" in kernel_mosaic.unsupported_reason(
      *args[:4], rules.ADAMW, None, too_big)
  assert kernel_mosaic.unsupported_reason(
      *args[:4], rules.ADAMW, None, WS_CONFIGS[1]) is None
  # Without the estimate's refusal, the lowering itself fails on that tile.
  monkeypatch.setattr(kernel_mosaic, "SMEM_BYTES", 10**9)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=too_big, interpret=False))
  with pytest.raises(Exception, match="shared memory"):
    fn.trace(*args).lower(lowering_platforms=("cuda",))


# --- int8 states (absmax blocks of 64, one fp32 scale each) ---------------

INT8_RULES = [rules.ADAMW, rules.LION, rules.RMSPROP, rules.ADAGRAD,
              rules.SGD_MOMENTUM]


def _quantized(rule, state):
  return tuple(quantization.quantize(s.astype(jnp.float32),
                                     n in rule.nonnegative_states)
               for s, n in zip(state, rule.state_names))


def _check_int8(got, want, w_tol):
  """W to ``w_tol`` (0: bitwise); int8 codes equal but for rare one-code
  steps (the kernel's sqrt is x·rsqrt(x) where Mosaic GPU has no sqrt, an
  ulp away), scales to fp32 rounding."""
  gw, gs = got
  rw, rs = want
  assert gw.dtype == rw.dtype
  if w_tol:
    assert rel_err(gw, rw) <= w_tol, rel_err(gw, rw)
  else:
    np.testing.assert_array_equal(np.asarray(gw, np.float32), np.asarray(rw, np.float32))
  for g, r in zip(gs, rs):
    assert isinstance(g, quantization.QuantizedArray) and g.nonnegative == r.nonnegative
    assert g.codes.dtype == jnp.int8 and g.scale.shape == r.scale.shape
    diff = np.abs(np.asarray(g.codes, np.int32) - np.asarray(r.codes, np.int32))
    assert diff.max() <= 1 and diff.mean() <= 1e-3, (diff.max(), diff.mean())
    assert rel_err(g.scale, r.scale) <= 1e-6, rel_err(g.scale, r.scale)


@pytest.mark.parametrize("interpret", INTERPRET)
@pytest.mark.parametrize("rule", INT8_RULES, ids=lambda r: r.name)
def test_int8_states_match_reference(rng, rule, interpret):
  # Several sub-tiles per tile and several tiles: each sub-tile's scales are
  # one row of the transposed scales, loaded and stored in place.
  args = _inputs(rng, rule, 128, 128, 384)
  args = (*args[:3], _quantized(rule, args[3]), args[4])
  config = MosaicConfig(block_m=128, block_n=128, max_concurrent_steps=2)
  got = _run(args, rule, config, interpret)
  want = fused_dw_update_reference(*args, rule=rule)
  _check_int8(got, want, 2e-6)


@pytest.mark.parametrize("interpret", INTERPRET)
def test_int8_states_with_stochastic_rounding_and_offsets(rng, interpret):
  # The model-scale mode: bf16 W rounded stochastically, int8 moments.
  args = _inputs(rng, rules.ADAMW, 64, 192, 256, w_dtype=jnp.bfloat16)
  args = (*args[:3], _quantized(rules.ADAMW, args[3]), args[4])
  kw = dict(rule=rules.ADAMW, seed=jnp.uint32(5), index_offset=(64, 256),
            index_width=1024)
  got = jax.jit(lambda *a: fused_dw_update(
      *a, implementation="mosaic", config=ONE_SUB, interpret=interpret,
      **kw))(*args)
  want = jax.jit(lambda *a: fused_dw_update_reference(*a, **kw))(*args)
  if interpret:  # the same arithmetic as the jitted reference: W bitwise
    _check_int8(got, want, 0)
  else:
    assert np.mean(np.asarray(got[0] == want[0])) >= 0.999
    _check_int8((got[0].astype(jnp.float32), got[1]),
                (want[0].astype(jnp.float32), want[1]), 2 ** -8)


@pytest.mark.parametrize("interpret", INTERPRET)
def test_int8_three_steps_match_the_unfused_loop(rng, interpret):
  rule = rules.ADAMW
  x, dy, w, state, _ = _inputs(rng, rule, 64, 64, 256)
  state = got_state = _quantized(rule, state)
  got_w = w
  for count in (1, 2, 3):
    hp = rule.pack({n: HYPERPARAMS[n] for n in rule.hyperparam_names}, count)
    x = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    got_w, got_state = _run((x, dy, got_w, got_state, hp), rule, ONE_SUB, interpret)
    w, state = fused_dw_update_reference(x, dy, w, state, hp, rule=rule)
  assert rel_err(got_w, w) <= 1e-5
  for g, r in zip(got_state, state):
    assert rel_err(quantization.dequantize(g), quantization.dequantize(r)) <= 1e-3


def test_int8_blocks_of_zeros_and_tiny_values(rng):
  # Where dY's columns are 0 the gradient is 0: blocks whose new moments are
  # all zero (scale 0, no NaN) or below the signed code's 1e-30 floor are
  # stored as the reference stores them.
  rule = rules.ADAMW
  x, dy, w, state, hp = _inputs(rng, rule, 64, 64, 256)
  dy = np.array(dy, np.float32)
  dy[:, :128] = 0.0
  mu, nu = (np.array(v, np.float32) for v in state)
  mu[:, :64] = 0.0
  nu[:, :128] = 0.0
  mu[:, 64:128] = 1e-35
  args = (x, jnp.asarray(dy, jnp.bfloat16), w,
          _quantized(rule, (jnp.asarray(mu), jnp.asarray(nu))), hp)
  got = _run(args, rule, ONE_SUB, True)
  want = fused_dw_update_reference(*args, rule=rule)
  _check_int8(got, want, 2e-6)
  for g in got[1]:
    np.testing.assert_array_equal(np.asarray(g.scale)[:, :2], 0.0)
    assert bool(jnp.all(jnp.isfinite(quantization.dequantize(g))))
    np.testing.assert_array_equal(np.asarray(quantization.dequantize(g))[:, :128], 0.0)


@pytest.mark.parametrize("config", [MosaicConfig(), MosaicConfig(
    block_m=128, block_n=128, compute_wgs=2, num_ctas=2)],
                         ids=["one-warpgroup", "warp-specialized"])
def test_int8_kernel_lowers_for_cuda_in_place(rng, config):
  # Lowered for CUDA on any machine; W, both codes and both scales are
  # aliased operand -> result (operands: x, dy, scalars, W, mu codes, mu
  # scales, nu codes, nu scales).
  args = _inputs(rng, rules.ADAMW, 128, 128, 512, w_dtype=jnp.bfloat16)
  args = (*args[:3], _quantized(rules.ADAMW, args[3]), args[4])
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rules.ADAMW, config=config, interpret=False, seed=jnp.uint32(3),
      in_place=True), donate_argnums=(2, 3))
  text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  call = text[text.index("custom_call @mosaic_gpu"):]
  aliases = call[call.index("output_operand_aliases"):].split("result_layouts")[0]
  for i in range(3, 8):
    assert f"operand_index = {i}" in aliases, aliases


@pytest.mark.skipif(not ON_GPU, reason="compiled warp-specialized kernel: "
                    "needs a GPU (its lowering is checked on the CPU above)")
def test_warp_specialized_int8_states(rng):
  # 2 stages: with 3, the 128×(2·128) tile and its int8 epilogue buffers
  # exceed a Hopper CTA's shared memory (refused before compiling).
  config = MosaicConfig(block_m=128, block_n=128, max_concurrent_steps=2,
                        compute_wgs=2, num_ctas=3)
  args = _inputs(rng, rules.ADAMW, 128, 256, 512)
  args = (*args[:3], _quantized(rules.ADAMW, args[3]), args[4])
  _check_int8(_run(args, rules.ADAMW, config, False),
              fused_dw_update_reference(*args, rule=rules.ADAMW), 2e-6)


def test_repeated_ops_lower_one_kernel(rng, monkeypatch):
  # An unrolled model calls the same op once per layer: JAX lowers the kernel
  # once and calls it (lowering a Mosaic kernel takes ~0.6 s of CPU). Lowered
  # for CUDA on any machine; the GPU check is lifted for the lowering only.
  from pallas_kernels.fused_dw import api  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(api, "_require_gpu", lambda *a: None)
  x, dy, w, st, hp = _inputs(rng, rules.ADAMW, 128, 128, 256)
  w2 = w + 1.0

  def layers(x, dy, w, w2, st, hp):
    new = []
    for v in (w, w2, w):  # three ops of one shape, different operands
      v, st = fused_dw_update(x, dy, v, st, hp, rule=rules.ADAMW,
                              implementation="mosaic", config=MosaicConfig())
      new.append(v)
    return new, st

  text = jax.jit(layers).trace(x, dy, w, w2, st, hp).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @mosaic_gpu") == 1
  assert text.count("call @forge_fused_dw_update_mosaic") == 3
  # A different static configuration is another kernel.
  def two_configs(x, dy, w, st, hp):
    a = fused_dw_update(x, dy, w, st, hp, rule=rules.ADAMW,
                        implementation="mosaic", config=MosaicConfig())
    b = fused_dw_update(x, dy, w, st, hp, rule=rules.ADAMW,
                        implementation="mosaic", config=MosaicConfig(block_n=64))
    return a, b
  text = jax.jit(two_configs).trace(x, dy, w, st, hp).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call @mosaic_gpu") == 2


def test_shared_kernel_call_keeps_results_and_traced_offsets(rng):
  # Through the shared jitted call: each op's own operands, static offsets
  # above int32, and traced offsets, all as the reference computes them.
  x, dy, w, st, hp = _inputs(rng, rules.ADAMW, 64, 64, 128, w_dtype=jnp.bfloat16)
  seed = jnp.uint32(7)
  for offset in [(0, 0), (2**31 + 5, 3)]:
    want = fused_dw_update_reference(x, dy, w, st, hp, rule=rules.ADAMW,
                                     seed=seed, index_offset=offset)
    got = fused_dw_update(x, dy, w, st, hp, rule=rules.ADAMW, seed=seed,
                          index_offset=offset, implementation="mosaic",
                          interpret=True)
    _check(got, want, 2e-6)
  traced = jax.jit(lambda r, c: fused_dw_update(
      x, dy, w, st, hp, rule=rules.ADAMW, seed=seed, index_offset=(r, c),
      implementation="mosaic", interpret=True))(jnp.int32(64), jnp.int32(128))
  _check(traced, fused_dw_update_reference(x, dy, w, st, hp, rule=rules.ADAMW,
                                           seed=seed, index_offset=(64, 128)),
         2e-6)
  # Python ints above int32: a seed, and beside a traced offset.
  big = 3_000_000_000
  want = fused_dw_update_reference(x, dy, w, st, hp, rule=rules.ADAMW,
                                   seed=big, index_offset=(64, 2**31 + 5))
  got = fused_dw_update(x, dy, w, st, hp, rule=rules.ADAMW, seed=big,
                        index_offset=(64, 2**31 + 5), implementation="mosaic",
                        interpret=True)
  _check(got, want, 2e-6)
  mixed = jax.jit(lambda r: fused_dw_update(
      x, dy, w, st, hp, rule=rules.ADAMW, seed=big, index_offset=(r, 2**31 + 5),
      implementation="mosaic", interpret=True))(jnp.int32(64))
  _check(mixed, want, 2e-6)


def test_shared_memory_estimate_covers_what_mosaic_allocates():
  # Lowered on jax 0.11.2, this warp-specialized int8 tile needs 233,696
  # bytes (over a CTA's 232,448); the buffers alone count 231,424. The
  # estimate refuses it before Mosaic GPU fails to lower it.
  sds = jax.ShapeDtypeStruct
  t, d_in, d_out = 8192, 4096, 14336
  x, dy = sds((t, d_in), jnp.bfloat16), sds((t, d_out), jnp.bfloat16)
  w = sds((d_in, d_out), jnp.float32)
  st = tuple(jax.eval_shape(lambda n=n: quantization.quantize(
      jnp.zeros((d_in, d_out)), n)) for n in (False, True))
  cfg = MosaicConfig(block_m=128, block_n=64, max_concurrent_steps=4,
                     compute_wgs=2)
  reason = kernel_mosaic.unsupported_reason(x, dy, w, st, rules.ADAMW, None, cfg)
  assert reason and "shared memory" in reason
  # The defaults stay well inside.
  for t_ in (512, 8192):
    for w_dtype in (jnp.float32, jnp.bfloat16):
      cfg = MosaicConfig.default(t_, d_in, d_out, int8_states=True)
      assert kernel_mosaic.unsupported_reason(
          sds((t_, d_in), jnp.bfloat16), sds((t_, d_out), jnp.bfloat16),
          sds((d_in, d_out), w_dtype), st, rules.ADAMW, None, cfg) is None


def _check_default_kernel_with_rounding(t, d_in, d_out, in_place, interpret,
                                        dy_scale=1.0):
  """The default MosaicConfig with bf16 W rounded stochastically and bf16
  moments (what a Llama step runs) against the reference with the same
  rounding bits: the update (new W - old W) and the moments to bf16
  rounding, and almost every new weight exactly the reference's."""
  keys = jax.random.split(jax.random.key(t + d_in + d_out), 5)
  x = jax.random.normal(keys[0], (t, d_in), jnp.bfloat16)
  dy = (dy_scale * jax.random.normal(keys[1], (t, d_out))).astype(jnp.bfloat16)
  w = jax.random.normal(keys[2], (d_in, d_out), jnp.bfloat16)
  mu = (0.1 * dy_scale * jax.random.normal(keys[3], (d_in, d_out))).astype(jnp.bfloat16)
  nu = jnp.square(0.1 * dy_scale * jax.random.normal(keys[4], (d_in, d_out))).astype(jnp.bfloat16)
  hp = rules.ADAMW.pack({n: HYPERPARAMS[n] for n in rules.ADAMW.hyperparam_names}, 7)
  seed = jnp.uint32(5)
  want = fused_dw_update_reference(x, dy, w, (mu, nu), hp, rule=rules.ADAMW,
                                   seed=seed)
  w0 = np.asarray(w, np.float32)
  copies = [jnp.copy(a) for a in (w, mu, nu)]
  got = jax.jit(lambda x, dy, w, mu, nu: fused_dw_update(
      x, dy, w, (mu, nu), hp, rule=rules.ADAMW, implementation="mosaic",
      interpret=interpret, in_place=in_place, seed=seed),
      donate_argnums=(2, 3, 4) if in_place else ())(x, dy, *copies)
  got_w, want_w = np.asarray(got[0], np.float32), np.asarray(want[0], np.float32)
  assert np.mean(got_w != want_w) <= 1e-3, np.mean(got_w != want_w)
  assert rel_err(got_w - w0, want_w - w0) <= 2 ** -7, rel_err(got_w - w0, want_w - w0)
  for g, r in zip(got[1], want[1]):
    assert g.dtype == r.dtype and rel_err(g, r) <= 2 ** -8, rel_err(g, r)


@pytest.mark.parametrize("dy_scale", [1.0, 1e-9], ids=["unit", "dW-near-eps"])
@pytest.mark.parametrize("in_place", [False, True])
def test_default_kernel_with_stochastic_rounding_matches_the_reference(in_place,
                                                                       dy_scale):
  # The check of the model-scale test below, small and in interpret mode
  # (where in_place runs on fresh buffers); also with dW and the moments at
  # a Llama step's magnitudes (around AdamW's eps).
  _check_default_kernel_with_rounding(64, 128, 256, in_place, interpret=True,
                                      dy_scale=dy_scale)


@pytest.mark.skipif(not ON_GPU, reason="the compiled kernel at model scale: "
                    "needs a GPU (the CPU test above runs the same check small)")
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("d_in,d_out", [(4096, 128256), (4096, 14336),
                                        (4096, 1024)],
                         ids=["8b-head", "8b-gate-up", "8b-k-v"])
@pytest.mark.parametrize("dy_scale", [1.0, 1e-9], ids=["unit", "dW-near-eps"])
def test_default_kernel_at_the_8b_shapes_matches_the_reference(d_in, d_out, in_place,
                                                               dy_scale):
  # Llama-3.1-8B at T=2048: the head (not in the benchmark tables' checks),
  # gate/up and k/v projections, each with its default tile; dY at unit
  # scale and at a Llama step's (dW near AdamW's eps). The unit-scale cases
  # passed on the H200 (stop 27, call A).
  _check_default_kernel_with_rounding(2048, d_in, d_out, in_place, interpret=False,
                                      dy_scale=dy_scale)


# --- int8 scales stored in the kernel's layout (QuantizedArray.scale_transposed)


@pytest.mark.parametrize("implementation", ["mosaic", "triton", "xla"])
def test_int8_transposed_scales_give_the_same_update(rng, implementation):
  # ForgeDense stores its int8 moments' scales as (out / 64, in), the Mosaic
  # kernel's layout; every implementation gives the update it gives with
  # the natural layout, and returns the states in the layout they came in.
  rule = rules.ADAMW
  args = _inputs(rng, rule, 64, 64, 192, w_dtype=jnp.bfloat16)
  natural = _quantized(rule, args[3])
  transposed = tuple(quantization.with_scale_layout(s, True) for s in natural)
  kw = dict(rule=rule, seed=jnp.uint32(9))
  if implementation == "xla":
    fn = jax.jit(lambda *a: fused_dw_update_reference(*a, **kw))
  else:
    fn = jax.jit(lambda *a: fused_dw_update(
        *a, implementation=implementation, interpret=True,
        config=ONE_SUB if implementation == "mosaic" else None, **kw))
  w_n, s_n = fn(*args[:3], natural, args[4])
  w_t, s_t = fn(*args[:3], transposed, args[4])
  np.testing.assert_array_equal(np.asarray(w_t, np.float32), np.asarray(w_n, np.float32))
  for a, b in zip(s_t, s_n):
    assert a.scale_transposed and not b.scale_transposed
    assert a.scale.shape == (192 // 64, 64)
    np.testing.assert_array_equal(np.asarray(a.codes), np.asarray(b.codes))
    np.testing.assert_array_equal(np.asarray(a.scale), np.asarray(b.scale).T)


def test_int8_scales_in_the_kernel_layout_are_not_transposed(rng):
  # Lowered for CUDA: with natural scales XLA transposes each state's fp32
  # scales in and out (4 transposes for AdamW); stored transposed, none.
  rule = rules.ADAMW
  args = _inputs(rng, rule, 128, 128, 256, w_dtype=jnp.bfloat16)
  natural = _quantized(rule, args[3])
  transposed = tuple(quantization.with_scale_layout(s, True) for s in natural)
  fn = jax.jit(lambda *a: kernel_mosaic.fused_dw_update_mosaic(
      *a, rule=rule, config=MosaicConfig(), interpret=False,
      seed=jnp.uint32(3), in_place=True), donate_argnums=(2, 3))

  def f32_transposes(state):
    text = fn.trace(*args[:3], state, args[4]).lower(
        lowering_platforms=("cuda",)).as_text()
    return [l for l in text.splitlines()
            if "stablehlo.transpose" in l and "xf32>" in l]
  assert len(f32_transposes(natural)) == 4
  assert f32_transposes(transposed) == []
