"""Fused dW + AdamW kernel against XLA, for one linear shape (first cut).

Checks every timed variant against the reference, then times (median of
``--reps`` runs after warm-up, inputs rotated over several buffers):

* ``xla dW``: dW = xᵀ·dY alone (bf16 operands, fp32 result),
* ``xla dW + adamw``: dW then the same AdamW rule, jitted, W and state donated
  (the unfused baseline),
* ``fused``: the Pallas Triton kernel for each tile config given,

beside the floor max(2·T·in·out / peak FLOP/s, bytes / peak bandwidth), with
both peaks measured in the same run. The full harness over the Llama and
Qwen shapes is the benchmark issue's job; this script is its seed.

    python -m experiments.bench_fused_dw --tokens 8192 --d-in 4096 --d-out 14336
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from forge_jax.rules import ADAMW
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference
from pallas_kernels.fused_dw import weight_grad_reference


def _time(fn, args_list, reps: int) -> float:
  """Median seconds of fn over rotating argument sets (after warm-up)."""
  out = fn(*args_list[0])
  jax.block_until_ready(out)
  times = []
  for i in range(reps):
    args = args_list[i % len(args_list)]
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def measure_peaks(n: int = 8192, reps: int = 20) -> tuple[float, float]:
  """(bf16 n×n×n matmul FLOP/s, copy bytes/s over 64·n² fp32) measured here."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda a, b: a @ b)
  t = _time(mm, [(a, b)], reps)
  flops = 2 * n**3 / t
  x = jax.random.normal(jax.random.key(2), (16 * n * n,), jnp.float32)  # 4 GiB at n=8192
  cp = jax.jit(lambda x: x * 1.0000001)
  t = _time(cp, [(x,)], reps)
  bw = 2 * x.size * 4 / t
  return flops, bw


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--tokens", type=int, default=8192)
  p.add_argument("--d-in", type=int, default=4096)
  p.add_argument("--d-out", type=int, default=14336)
  p.add_argument("--reps", type=int, default=30)
  p.add_argument("--configs", default="default;128,128,32,8,8,4;"
                 "128,256,32,8,8,3;64,128,64,8,4,3;128,64,64,8,4,3",
                 help="'default' or block_m,block_n,block_t,group_m,num_warps,"
                 "num_stages; several separated by ';'")
  p.add_argument("--peak-size", type=int, default=8192)
  p.add_argument("--out", default="experiments/results")
  a = p.parse_args()
  t, d_in, d_out = a.tokens, a.d_in, a.d_out
  rng = np.random.default_rng(0)
  sets = []
  for _ in range(3):  # rotate inputs so that L2 does not flatter
    sets.append((jnp.asarray(rng.standard_normal((t, d_in)), jnp.bfloat16),
                 jnp.asarray(rng.standard_normal((t, d_out)), jnp.bfloat16)))
  hp = ADAMW.pack(dict(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8,
                       weight_decay=0.01), 7)

  def fresh_state():
    w = jnp.asarray(rng.standard_normal((d_in, d_out)), jnp.float32)
    mu = jnp.asarray(0.01 * rng.standard_normal((d_in, d_out)), jnp.float32)
    nu = jnp.asarray(1e-4 * rng.random((d_in, d_out)), jnp.float32)
    return w, mu, nu

  flops_peak, bw_peak = measure_peaks(a.peak_size)
  flops = 2 * t * d_in * d_out
  # Must move: x and dY once (bf16), W, mu, nu read and written (fp32).
  bytes_min = 2 * t * (d_in + d_out) + 2 * 3 * 4 * d_in * d_out
  floor = max(flops / flops_peak, bytes_min / bw_peak)
  rows = []

  dw = jax.jit(weight_grad_reference)
  rows.append(("xla dW", _time(dw, sets, a.reps), None))

  def unfused(x, dy, w, mu, nu, hp):
    nw, (nmu, nnu) = fused_dw_update_reference(x, dy, w, (mu, nu), hp, rule=ADAMW)
    return nw, nmu, nnu

  def run_stateful(fn, name, check_cfg=None):
    """Times fn(x, dy, w, mu, nu, hp) -> (w, mu, nu) with state donated."""
    w, mu, nu = fresh_state()
    # Check against the reference on fresh copies first.
    ref = unfused(*sets[0], w, mu, nu, hp)
    got = fn(*sets[0], jnp.copy(w), jnp.copy(mu), jnp.copy(nu), hp)
    err = max(float(jnp.linalg.norm(g - r) / jnp.linalg.norm(r)) for g, r in zip(got, ref))
    state = [w, mu, nu]
    out = fn(*sets[0], *state, hp)
    jax.block_until_ready(out)
    times = []
    for i in range(a.reps):
      x, dy = sets[i % len(sets)]
      t0 = time.perf_counter()
      out = fn(x, dy, *out, hp)
      jax.block_until_ready(out)
      times.append(time.perf_counter() - t0)
    rows.append((name, float(np.median(times)), err))

  run_stateful(jax.jit(unfused, donate_argnums=(2, 3, 4)), "xla dW + adamw (donated)")
  for spec in a.configs.split(";"):
    if spec == "default":
      cfg = FusedDWConfig.default(t, d_in, d_out, jnp.bfloat16)
    else:
      cfg = FusedDWConfig(*(int(v) for v in spec.split(",")))
    bm, bn, bt, gm, nw, ns = (cfg.block_m, cfg.block_n, cfg.block_t,
                              cfg.group_m, cfg.num_warps, cfg.num_stages)

    def fused(x, dy, w, mu, nu, hp, cfg=cfg):
      nw_, (nmu, nnu) = fused_dw_update(x, dy, w, (mu, nu), hp, rule=ADAMW,
                                        implementation="triton", config=cfg)
      return nw_, nmu, nnu
    try:
      run_stateful(jax.jit(fused, donate_argnums=(2, 3, 4)),
                   f"fused {bm}x{bn}x{bt} g{gm} w{nw} s{ns}")
    except Exception as e:  # a config that does not compile is reported
      rows.append((f"fused {spec}", float("nan"), f"error: {type(e).__name__}: {str(e)[:120]}"))

  base = rows[1][1]
  print(f"\nT={t} in={d_in} out={d_out}: {flops / 1e12:.2f} TFLOP, "
        f"{bytes_min / 1e9:.2f} GB must move; measured peaks "
        f"{flops_peak / 1e12:.0f} TFLOP/s, {bw_peak / 1e12:.2f} TB/s; "
        f"floor {floor * 1e3:.3f} ms ({jax.devices()[0].device_kind}, jax {jax.__version__})")
  print("| variant | ms | % of floor | speed-up vs unfused | TFLOP/s | rel err |")
  print("|---|---|---|---|---|---|")
  for name, sec, err in rows:
    e = "" if err is None else (f"{err:.1e}" if isinstance(err, float) else err)
    print(f"| {name} | {sec * 1e3:.3f} | {100 * floor / sec:.0f}% | "
          f"{base / sec:.2f}x | {flops / sec / 1e12:.0f} | {e} |")
  os.makedirs(a.out, exist_ok=True)
  with open(os.path.join(a.out, f"bench_fused_dw_{int(time.time())}.json"), "w") as f:
    json.dump({"shape": [t, d_in, d_out], "floor_s": floor, "peak_flops": flops_peak,
               "peak_bw": bw_peak, "device": jax.devices()[0].device_kind,
               "jax": jax.__version__,
               "rows": [{"variant": n, "seconds": s, "rel_err": e} for n, s, e in rows]},
              f, indent=1)


if __name__ == "__main__":
  main()
