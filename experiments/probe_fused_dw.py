"""Where the fused kernel's time goes: tile configurations and operand layouts.

For one linear shape, times (each checked against the reference first, via
``autotune.autotune(..., write=False)``) the fused kernel for

* SGD without momentum on fp32 W (the matmul plus reading and writing W: the
  closest the kernel gets to a plain dW), and
* AdamW with fp32 W and fp32 moments (three arrays read and written),

over a list of tile configurations (with ``prefetch``: the epilogue's W and
state tiles loaded before the token loop), x read as (T, in) and transposed
in the dot, or with ``--transpose-x`` also passed pre-transposed. XLA's dW alone and the
unfused dW + AdamW (donated) are timed beside them, with the floor. The gap
between the SGD row and XLA's dW is the matmul's own cost in the kernel; the
gap between AdamW and SGD is the epilogue's.

    python -m experiments.probe_fused_dw --shape 8192:4096x14336
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import bench_fused_dw as bench
from forge_jax.rules import ADAMW, SGD
from pallas_kernels.fused_dw import FusedDWConfig, autotune, weight_grad_reference

# (block_m, block_n, block_t, num_warps, num_stages, prefetch[, epilogue_split])
CONFIGS = (
    (128, 128, 64, 8, 3, 0), (128, 128, 64, 8, 4, 0), (128, 128, 64, 8, 4, 1),
    (128, 128, 64, 8, 4, 2), (128, 128, 64, 8, 4, 3), (128, 128, 64, 8, 3, 3),
    (128, 256, 64, 8, 3, 0), (128, 256, 64, 8, 3, 1), (128, 64, 64, 4, 4, 3),
    (64, 128, 64, 4, 4, 3), (128, 64, 64, 8, 4, 3), (64, 256, 64, 8, 4, 3),
    (128, 128, 64, 8, 3, 0, 2), (128, 128, 64, 8, 4, 0, 2),
    (128, 128, 64, 8, 3, 0, 4), (128, 256, 64, 8, 3, 0, 4),
)


def parse_configs(spec: str) -> tuple:
  """``"bm,bn,bt,warps,stages,prefetch[,split];..."`` as CONFIGS tuples."""
  out = []
  for item in spec.split(";"):
    try:
      fields = tuple(int(v) for v in item.split(","))
    except ValueError:
      raise argparse.ArgumentTypeError(
          f"--configs entry {item!r} must be comma-separated integers") from None
    if len(fields) not in (6, 7):
      raise argparse.ArgumentTypeError(
          f"--configs entry {item!r} needs 6 or 7 integers, got {len(fields)}")
    bm, bn, bt, warps, stages, prefetch, *rest = fields
    try:  # checked now, not after the peaks were measured
      FusedDWConfig(bm, bn, bt, 8, warps, stages, prefetch=prefetch,
                    epilogue_split=(rest or [1])[0])
    except ValueError as e:
      raise argparse.ArgumentTypeError(f"--configs entry {item!r}: {e}") from None
    out.append(fields)
  return tuple(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shape", default="8192:4096x14336")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--transpose-x", action="store_true",
                 help="also try every configuration with x pre-transposed")
  p.add_argument("--configs", default=None, type=parse_configs,
                 help="tiles to try instead of the built-in list: "
                      "'bm,bn,bt,warps,stages,prefetch[,epilogue_split];...'")
  p.add_argument("--rules", default="sgd,adamw",
                 help="comma-separated subset of sgd,adamw")
  p.add_argument("--out", default="experiments/results")
  a = p.parse_args(argv)
  unknown = set(a.rules.split(",")) - {SGD.name, ADAMW.name}
  if unknown:
    p.error(f"--rules: {sorted(unknown)} not in ['sgd', 'adamw']")
  rules = [r for r in (SGD, ADAMW) if r.name in a.rules.split(",")]
  t, dims = a.shape.split(":")
  t, (d_in, d_out) = int(t), map(int, dims.split("x"))
  rng = np.random.default_rng(0)
  flops_peak, bw_peak = bench.measure_peaks()
  x = jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16)
  dy = jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
  mu = jnp.asarray(1e-2 * rng.standard_normal((d_in, d_out)), jnp.float32)
  nu = mu * mu
  rows = [dict(variant="xla dW", seconds=bench._time(
      jax.jit(weight_grad_reference), [(x, dy)], a.reps), bytes=2 * t * (d_in + d_out) + 4 * d_in * d_out)]
  for rule, state in ((r, () if r is SGD else (mu, nu)) for r in rules):
    hp = rule.pack({n: bench.HYPERPARAMS[n] for n in rule.hyperparam_names}, 7)
    moved = 2 * t * (d_in + d_out) + 8 * d_in * d_out * (1 + len(state))
    r = bench.bench_case(rule, "fp32", t, d_in, d_out, [(x, dy)], a.reps, rng)
    rows.append(dict(variant=f"{rule.name} unfused (xla dW + update, donated)",
                     seconds=r["unfused_s"], bytes=moved))
    configs = [FusedDWConfig(bm, bn, bt, 8, wp, st, transpose_x=tx, prefetch=pf,
                             epilogue_split=(rest or (1,))[0])
               for bm, bn, bt, wp, st, pf, *rest in (a.configs or CONFIGS)
               for tx in ((False, True) if a.transpose_x else (False,))
               if pf <= len(state) + 1 and (pf <= 1 or state)]
    _, results = autotune.autotune(x, dy, w, state, hp, rule=rule,
                                   configs=configs, reps=a.reps, write=False)
    for res in results:
      c = res["config"]
      name = (f"{rule.name} fused {c['block_m']}x{c['block_n']}x{c['block_t']} "
              f"w{c['num_warps']} s{c['num_stages']}"
              + (f" p{c['prefetch']}" if c["prefetch"] else "")
              + (f" e{c['epilogue_split']}" if c["epilogue_split"] > 1 else "")
              + (" xT" if c["transpose_x"] else ""))
      rows.append(dict(variant=name, seconds=res.get("seconds"),
                       error=res.get("error"), bytes=moved))
    print(json.dumps(rows[-1]), flush=True)
  flops = 2 * t * d_in * d_out
  print(f"\n{jax.devices()[0].device_kind}, jax {jax.__version__}; T={t}, "
        f"{d_in}->{d_out}; peaks {flops_peak / 1e12:.0f} TFLOP/s, "
        f"{bw_peak / 1e12:.2f} TB/s")
  print("| variant | ms | floor ms | % of floor | TFLOP/s |")
  print("|---|---|---|---|---|")
  for r in rows:
    floor = max(flops / flops_peak, r["bytes"] / bw_peak)
    if r.get("seconds") is None:
      print(f"| {r['variant']} | {r.get('error')} | | | |")
      continue
    print(f"| {r['variant']} | {r['seconds'] * 1e3:.3f} | {floor * 1e3:.3f} | "
          f"{100 * floor / r['seconds']:.0f}% | {flops / r['seconds'] / 1e12:.0f} |")
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, f"probe_fused_dw_T{t}_{d_in}x{d_out}_{int(time.time())}.json")
  with open(path, "w") as f:
    json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                   shape=[t, d_in, d_out], peak_flops=flops_peak,
                   peak_bw=bw_peak, rows=rows), f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
