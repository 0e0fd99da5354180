"""The optimizer update alone over a ~1B-parameter tree: fold_adam vs optax.adamw.

One jitted ``update`` + ``apply_updates`` with params and state donated, over
``--leaves`` fp32 matrices of ``--shape`` (default 32 x (4096, 8192) = 1.07B
parameters), gradients given. fold_adam keeps its moments 2**l times smaller,
so it reads and writes fewer bytes; the floor is the bytes that must move
(params read+written, gradient read, moments read+written) over the measured
copy bandwidth. Prints one table (median of ``--reps`` after warm-up) and the
ratio against optax.adamw.

    python -m experiments.bench_fold_update
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import forge_jax as fj


def _median_time(fn, carry, rest, reps):
  carry = fn(*carry, *rest)
  jax.block_until_ready(carry)
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    carry = fn(*carry, *rest)
    jax.block_until_ready(carry)
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--leaves", type=int, default=32)
  p.add_argument("--shape", default="4096x8192")
  p.add_argument("--reps", type=int, default=10)
  p.add_argument("--out", default="experiments/results")
  a = p.parse_args(argv)
  shape = tuple(int(v) for v in a.shape.split("x"))
  n = a.leaves * int(np.prod(shape))
  key = jax.random.key(0)
  params = {f"w{i}": jax.random.normal(jax.random.fold_in(key, i), shape) * 0.02
            for i in range(a.leaves)}
  grads = {k: jax.random.normal(jax.random.fold_in(key, 1000 + i), shape) * 1e-3
           for i, k in enumerate(params)}
  # Peak bandwidth: an fp32 elementwise pass over the gradients' bytes.
  big = jnp.concatenate([g.reshape(-1) for g in list(grads.values())[:8]])
  scale = jax.jit(lambda x: x * 1.0000001)
  bw = 2 * big.nbytes / _median_time(lambda x: (scale(x),), (big,), (), a.reps)
  del big

  variants = {
      "optax.adamw": (optax.adamw(1e-3), 8),
      "fold_adam l=2": (fj.fold_adam(1e-3, fold_level=2), 8 / 4),
      "fold_adam l=3": (fj.fold_adam(1e-3, fold_level=3), 8 / 8),
      "fold_adam l=4": (fj.fold_adam(1e-3, fold_level=4), 8 / 16),
      "fold_adam l=3 int8": (fj.fold_adam(1e-3, fold_level=3, mu_dtype=jnp.int8,
                                          nu_dtype=jnp.int8), 2 * 1.0625 / 8),
  }
  rows = []
  for name, (tx, state_bytes_per_param) in variants.items():
    def step(params, state, grads, tx=tx):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state
    jstep = jax.jit(step, donate_argnums=(0, 1))
    p0 = jax.tree.map(jnp.copy, params)
    s0 = jax.jit(tx.init)(p0)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(s0))
    t = _median_time(lambda p, s, g: jstep(p, s, g), (p0, s0), (grads,), a.reps)
    moved = n * (4 * 2 + 4) + 2 * n * state_bytes_per_param
    rows.append(dict(variant=name, seconds=t, state_bytes=state_bytes,
                     bytes_moved=moved, floor_s=moved / bw))
    del p0, s0
    print(json.dumps(rows[-1]), flush=True)
  base = rows[0]["seconds"]
  print(f"\n{n / 1e9:.2f}B fp32 params ({a.leaves} x {shape}); measured bandwidth "
        f"{bw / 1e12:.2f} TB/s; {jax.devices()[0].device_kind}, jax {jax.__version__}")
  print("| variant | update ms | floor ms | % of floor | state GiB | speed-up vs optax.adamw |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['variant']} | {r['seconds'] * 1e3:.2f} | {r['floor_s'] * 1e3:.2f} | "
          f"{100 * r['floor_s'] / r['seconds']:.0f}% | {r['state_bytes'] / 2**30:.2f} | "
          f"{base / r['seconds']:.2f}x |")
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, f"bench_fold_update_{int(time.time())}.json")
  with open(path, "w") as f:
    json.dump({"params": n, "bandwidth": bw, "device": jax.devices()[0].device_kind,
               "jax": jax.__version__, "rows": rows}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
