"""Tile configurations of the Mosaic GPU fused kernel against Triton and XLA.

For each shape (T:in x out) and storage mode, times the rule's (``--rule``:
AdamW, or SGD, whose kernel is its token loop and W's own pass) unfused step
(XLA dW, then the update, W and state donated; ``xla``: dW in fp32, the op's
reference; ``xla-bf16dW``: the matmul gives dW in bf16, as an unfused step
with bf16 parameters such as optax's keeps it, timed only), the Triton kernel (default tile)
and the Mosaic kernel with each named :class:`MosaicConfig`, each checked
against the unfused result first, and prints one line per shape with the
floor (nominal H200 peaks, as ``bench_fused_dw``). Times are per op of
``--chain`` ops chained in one jitted call, the median of three rounds,
each checked as a chain against the unfused chain (``bench_fused_dw
--timing chain``; ``--chain 0``: one op per jitted call, as up to stop
23):

    python -m experiments.probe_mosaic --shapes 8192:4096x14336 \\
        --configs m128n128t64s3,WS_B_n128s3e16

``--interpret`` runs the kernels in interpret mode (a CPU smoke test; the
warp-specialized and ``noT`` configurations are GPU-only and are reported as
errors there).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from experiments.bench_fused_dw import CHECK_LEARNING_RATE, _Variant
from experiments.bench_fused_dw import _flat, _unflat, floor_s, own_seed
from experiments.bench_fused_dw import RULES
from experiments.bench_fused_dw import UNFUSED_GRAD_DTYPES
from experiments.bench_fused_dw import step_args
from pallas_kernels import quantization
from pallas_kernels.fused_dw import MosaicConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference

C = MosaicConfig
# Names: m<block_m>n<block_n>t<block_t>s<max_concurrent_steps>, then x<N> = N
# epilogue slots, a<N> = epi_ahead N, e<N> = epilogue sub-tiles 64 × N, noT = x fed through
# a transposed shared-memory view (transpose_x=False); WS_* = warp-specialized
# (compute_wgs=2, tile block_m × 2·block_n); PP_* = ping-pong (compute_wgs=2,
# ping_pong=True, tiles block_m × block_n).
CONFIGS = {
    # one warpgroup per CTA, one CTA per (block_m, block_n) tile
    "m128n128t64s3": C(128, 128, 64, 3),
    "m128n128t64s3noT": C(128, 128, 64, 3, transpose_x=False),
    "m128n128t64s3x3e32": C(128, 128, 64, 3, epi_slots=3, epi_n=32),
    "m64n128t64s4x3": C(64, 128, 64, 4, epi_slots=3),
    "m64n128t64s4": C(64, 128, 64, 4),
    "m64n128t64s4noT": C(64, 128, 64, 4, transpose_x=False),
    "m64n64t64s4": C(64, 64, 64, 4),
    "m128n128t64s3x4a3e32noT": C(128, 128, 64, 3, epi_slots=4, epi_ahead=3,
                                 epi_n=32, transpose_x=False),
    # warp-specialized, persistent, two compute warpgroups
    "WS_A_n128s2e32": C(128, 128, 64, 2, epi_n=32, compute_wgs=2),
    "WS_B_n128s3e16": C(128, 128, 64, 3, epi_n=16, compute_wgs=2),
    "WS_C_n64s4e32": C(128, 64, 64, 4, epi_n=32, compute_wgs=2),
    "WS_F_n64s4e32noT": C(128, 64, 64, 4, epi_n=32, compute_wgs=2,
                          transpose_x=False),
    "WS_G_n128s2": C(128, 128, 64, 2, compute_wgs=2),
    "WS_H_n64s3": C(128, 64, 64, 3, compute_wgs=2),
    # ping-pong: the two compute warpgroups take alternate (block_m, block_n)
    # tiles, one's token loop beside the other's epilogue
    "PP_n128s3e32": C(128, 128, 64, 3, epi_n=32, compute_wgs=2, ping_pong=True),
    "PP_n128s3e32noT": C(128, 128, 64, 3, epi_n=32, compute_wgs=2,
                         ping_pong=True, transpose_x=False),
    "PP_n128s4e16": C(128, 128, 64, 4, epi_n=16, compute_wgs=2, ping_pong=True),
    "PP_n128s3": C(128, 128, 64, 3, compute_wgs=2, ping_pong=True),
    "PP_m64n128s4": C(64, 128, 64, 4, compute_wgs=2, ping_pong=True),
    "PP_m64n256s3e32": C(64, 256, 64, 3, epi_n=32, compute_wgs=2, ping_pong=True),
    "PP_n128s4e32": C(128, 128, 64, 4, epi_n=32, compute_wgs=2, ping_pong=True),
    "PP_n128s4e32noT": C(128, 128, 64, 4, epi_n=32, compute_wgs=2,
                         ping_pong=True, transpose_x=False),
    "PP_n128s4e16x4a3": C(128, 128, 64, 4, epi_n=16, epi_slots=4, epi_ahead=3,
                          compute_wgs=2, ping_pong=True),
    "PP_n128s5e16": C(128, 128, 64, 5, epi_n=16, compute_wgs=2, ping_pong=True),
    "PP_n128s4e64": C(128, 128, 64, 4, compute_wgs=2, ping_pong=True),
    "PP_n128s5e32": C(128, 128, 64, 5, epi_n=32, compute_wgs=2, ping_pong=True),
    "PP_n128s5e32noT": C(128, 128, 64, 5, epi_n=32, compute_wgs=2,
                         ping_pong=True, transpose_x=False),
    "PP_n128s4e32x4a3": C(128, 128, 64, 4, epi_n=32, epi_slots=4, epi_ahead=3,
                          compute_wgs=2, ping_pong=True),
    "PP_m64n128s5": C(64, 128, 64, 5, compute_wgs=2, ping_pong=True),
    # stop 26: the epilogue's loads in flight (bf16 W and states: a 64×64
    # sub-tile is 8 KiB per array, half the fp32 one). E = early_epilogue.
    "m128n128t64s3E": C(128, 128, 64, 3, early_epilogue=True),
    "m128n128t64s3e128": C(128, 128, 64, 3, epi_n=128),
    "m128n128t64s3e128E": C(128, 128, 64, 3, epi_n=128, early_epilogue=True),
    "m128n128t64s3x3": C(128, 128, 64, 3, epi_slots=3),
    "m128n128t64s3x4a3": C(128, 128, 64, 3, epi_slots=4, epi_ahead=3),
    "m128n128t64s3x4a4": C(128, 128, 64, 3, epi_slots=4, epi_ahead=4),
    "m64n128t64s2": C(64, 128, 64, 2),
    "m64n128t64s4e128": C(64, 128, 64, 4, epi_n=128),
    "PP_n128s4a1": C(128, 128, 64, 4, epi_ahead=1, compute_wgs=2, ping_pong=True),
    "PP_n128s2x3": C(128, 128, 64, 2, epi_slots=3, compute_wgs=2, ping_pong=True),
    "PP_n128s2x3a3": C(128, 128, 64, 2, epi_slots=3, epi_ahead=3,
                       compute_wgs=2, ping_pong=True),
    "PP_n128s3e32x3": C(128, 128, 64, 3, epi_slots=3, epi_n=32, compute_wgs=2,
                        ping_pong=True),
    # stop 36, T=512: the first sub-tiles' loads issued before the token loop
    # with few enough stages that two CTAs still fit on a multiprocessor
    # (stop 26's m128n128t64s3E needed 144 KiB: one CTA)
    "m128n128t64s2noT": C(128, 128, 64, 2, transpose_x=False),
    "m128n128t64s2Ee32noT": C(128, 128, 64, 2, epi_n=32, early_epilogue=True,
                              transpose_x=False),
    "m128n128t64s2Ee32x3noT": C(128, 128, 64, 2, epi_n=32, epi_slots=3,
                                early_epilogue=True, transpose_x=False),
    "m128n128t64s2Ee32x4a3noT": C(128, 128, 64, 2, epi_n=32, epi_slots=4,
                                  epi_ahead=3, early_epilogue=True,
                                  transpose_x=False),
    "m128n128t64s2EnoT": C(128, 128, 64, 2, early_epilogue=True,
                           transpose_x=False),
    "m128n128t64s3x3noT": C(128, 128, 64, 3, epi_slots=3, transpose_x=False),
    "m128n128t64s2Ee32": C(128, 128, 64, 2, epi_n=32, early_epilogue=True),
    # stop 36, T=512: ping-pong and cooperative tiles with x through the view
    "PP_n128s2e32noT": C(128, 128, 64, 2, epi_n=32, compute_wgs=2,
                         ping_pong=True, transpose_x=False),
    "PP_n128s4e64noT": C(128, 128, 64, 4, compute_wgs=2, ping_pong=True,
                         transpose_x=False),
    "PP_n128s4e32x3noT": C(128, 128, 64, 4, epi_n=32, epi_slots=3,
                           compute_wgs=2, ping_pong=True, transpose_x=False),
    "PP_n128s2e32x4a3noT": C(128, 128, 64, 2, epi_n=32, epi_slots=4,
                             epi_ahead=3, compute_wgs=2, ping_pong=True,
                             transpose_x=False),
    "WS_n128s3e32noT": C(128, 128, 64, 3, epi_n=32, compute_wgs=2,
                         transpose_x=False),
    # stop 39, T=512: the tile order (g<N> = group_m N: tile rows per group,
    # column-major inside it) and a wider one-warpgroup tile
    **{f"m128n128t64s3noTg{g}": C(128, 128, 64, 3, transpose_x=False, group_m=g)
       for g in (1, 2, 4, 16, 32)},
    "m64n256t64s2noT": C(64, 256, 64, 2, transpose_x=False),
}
HP = dict(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--shapes", default="2048:4096x14336",
                 help="T:inxout, several separated by ','")
  p.add_argument("--modes", default="fp32",
                 help="fp32 and/or bf16 (W and states), int8 (fp32 W, int8 "
                 "states); bf16-sr, int8-sr: bf16 W written with stochastic "
                 "rounding, bf16 / int8 states")
  p.add_argument("--configs", default=",".join(CONFIGS),
                 help="comma-separated names: m<block_m>n<block_n>t<block_t>"
                 "s<stages>, x3 = 3 epilogue slots, e<N> = epilogue sub-tile "
                 "width, noT = transpose_x=False, WS_* = warp-specialized "
                 "(compute_wgs=2), PP_* = ping-pong; those and noT are "
                 "GPU-only")
  p.add_argument("--reps", type=int, default=20, help="timed ops per variant "
                 "(per round with --chain)")
  p.add_argument("--chain", type=int, default=3,
                 help="ops chained in one jitted call (0: one per call)")
  p.add_argument("--rule", choices=("adamw", "sgd"), default="adamw",
                 help="the optimizer: sgd has no state, so its kernel is "
                 "nearly the token loop alone (W read and written)")
  p.add_argument("--no-triton", action="store_true",
                 help="leave out the Triton kernel (XLA's unfused step and the "
                 "named Mosaic configurations only)")
  p.add_argument("--interpret", action="store_true",
                 help="interpret mode on the CPU (correctness only; the floor "
                 "and times are meaningless there)")
  a = p.parse_args(argv)
  if a.chain < 0 or a.reps < 1:
    raise SystemExit("--chain must be >= 0 and --reps >= 1")
  names = a.configs.split(",")
  for n in names:
    if n not in CONFIGS:
      raise SystemExit(f"--configs: {n!r} is not one of {list(CONFIGS)}")
  rule = RULES[a.rule]
  hp_values = {n: HP[n] for n in rule.hyperparam_names}
  hp = rule.pack(hp_values, 7)
  hp_check = rule.pack(dict(hp_values, learning_rate=CHECK_LEARNING_RATE), 7)
  print(jax.__version__, jax.devices()[0].device_kind, flush=True)
  lines = []
  for spec in a.shapes.split(","):
    t, dims = spec.split(":")
    t, (d_in, d_out) = int(t), map(int, dims.split("x"))
    key = jax.random.key(t + d_in)
    sets = [(jax.random.normal(jax.random.fold_in(key, 2 * i), (t, d_in), jnp.bfloat16),
             jax.random.normal(jax.random.fold_in(key, 2 * i + 1), (t, d_out),
                               jnp.bfloat16)) for i in range(3)]
    for mode in a.modes.split(","):
      if mode not in ("fp32", "bf16", "int8", "bf16-sr", "int8-sr"):
        raise SystemExit(f"--modes: {mode!r} is not fp32, bf16, int8, "
                         "bf16-sr or int8-sr")
      if a.rule == "sgd" and mode.startswith("int8"):
        raise SystemExit(f"--modes: {mode!r} sets the states' storage, and "
                         "--rule sgd has no state (use fp32, bf16 or bf16-sr)")
      dtype = jnp.bfloat16 if mode.startswith("bf16") else jnp.float32
      sr = mode.endswith("-sr")
      # The rounding seed is an argument after the hyperparameters; a chain
      # gives each op its own (bench_fused_dw.chained).
      seeds = [jnp.uint32(12345)] if sr else []
      w = jax.random.normal(jax.random.fold_in(key, 9), (d_in, d_out),
                            jnp.bfloat16 if sr else dtype)
      mu = (1e-2 * jax.random.normal(jax.random.fold_in(key, 10), (d_in, d_out))
            ).astype(dtype)
      nu = ((1e-2 * jax.random.normal(jax.random.fold_in(key, 11), (d_in, d_out)))
            ** 2).astype(dtype)
      if mode.startswith("int8"):
        mu, nu = quantization.quantize(mu, False), quantization.quantize(nu, True)
      like = (mu, nu) if rule.state_names else ()

      def make_step(impl, cfg=None):
        n_flat = len(_flat(w, like))

        def step(x, dy, *args):
          flat, hp_, seed = step_args(args, n_flat)
          w_, st = _unflat(flat, like)
          if impl in UNFUSED_GRAD_DTYPES:
            nw, ns = fused_dw_update_reference(
                x, dy, w_, st, hp_, rule=rule, seed=seed,
                grad_dtype=UNFUSED_GRAD_DTYPES[impl])
          else:
            nw, ns = fused_dw_update(x, dy, w_, st, hp_, rule=rule,
                                     implementation=impl, config=cfg,
                                     interpret=a.interpret, in_place=True,
                                     seed=seed)
          return tuple(_flat(nw, ns))
        return _Variant(step, n_flat, sets, a.reps, a.chain, 3,
                        own_seed if sr else None)

      copy = lambda: [jnp.copy(v) for v in _flat(w, like)]  # noqa: E731
      unfused = make_step("xla")
      want = unfused.results(copy, [hp_check, *seeds])
      times = {"xla": unfused.seconds(copy(), [hp, *seeds])}
      t0 = time.time()
      times["xla-bf16dW"] = make_step("xla-bf16dW").seconds(copy(), [hp, *seeds])
      print(f"T={t} {d_in}x{d_out} {mode} xla-bf16dW: {times['xla-bf16dW'] * 1e3:.3f} ms "
            f"(unchecked baseline; compile+run {time.time() - t0:.1f}s)", flush=True)
      for name, impl, cfg in [("triton", "triton", None)] * (not a.no_triton) + [
          (n, "mosaic", CONFIGS[n]) for n in names]:
        t0 = time.time()
        try:
          fn = make_step(impl, cfg)
          err = fn.error(copy, [hp_check, *seeds], want)
          if not err <= fn.max_rel_err:  # checked first: a wrong kernel is not timed
            print(f"T={t} {d_in}x{d_out} {mode} {name}: WRONG, rel err "
                  f"{err:.1e} against the unfused step{'s' if a.chain else ''}",
                  flush=True)
            continue
          times[name] = fn.seconds(copy(), [hp, *seeds])
          print(f"T={t} {d_in}x{d_out} {mode} {name}: {times[name] * 1e3:.3f} ms "
                f"err {err:.1e} (compile+run {time.time() - t0:.1f}s)", flush=True)
        except Exception as e:  # noqa: BLE001 -- reported, the sweep goes on
          print(f"T={t} {d_in}x{d_out} {mode} {name}: ERROR {type(e).__name__}: "
                f"{str(e)[:300]}", flush=True)
      size = jnp.dtype(w.dtype).itemsize
      states = (0 if not like else
                2 * (1 + 4 / quantization.BLOCK_SIZE) if mode.startswith("int8")
                else 2 * jnp.dtype(dtype).itemsize)
      moved = 2 * t * (d_in + d_out) + 2 * d_in * d_out * (size + states)
      floor = floor_s(t, d_in, d_out, moved, 790e12, 4.3e12)
      lines.append(f"## T={t} {d_in}x{d_out} {mode} {a.rule} floor (H200) {floor * 1e3:.3f} ms | "
                   + " | ".join(f"{k} {v * 1e3:.3f} ({floor / v * 100:.0f}%)"
                                for k, v in times.items()))
  print("\n".join(lines))
  return lines


if __name__ == "__main__":
  main()
