"""Per-op time of the fused kernels alone per jitted call and chained in one jit.

``bench_fused_dw`` times one op per jitted call, so a short op also carries
the host's dispatch of that call. In training many ops run inside one jitted
step. For each shape (T:in x out) and implementation this times AdamW (fp32
states, W and state donated) two ways: one op per call, and ``--chain`` ops
applied one after the other to the same W and state inside one jitted
function (time per op). Each chained result is checked against the
reference applied as many times first. Prints one markdown table last:

    python -m experiments.probe_dispatch \\
        --shapes 512:4096x1024,2048:4096x4096,512:4096x14336,8192:4096x1024

The XLA reference is not timed chained: XLA computes the repeated dW once
and merges the chained updates, so its per-op figure would not be one op's.
``--interpret`` runs the kernels in interpret mode (a CPU smoke test).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from experiments.bench_fused_dw import MAX_REL_ERR, _rel_err
from forge_jax.rules import ADAMW
from pallas_kernels.fused_dw import FusedDWConfig
from pallas_kernels.fused_dw import MosaicConfig
from pallas_kernels.fused_dw import fused_dw_update
from pallas_kernels.fused_dw import fused_dw_update_reference

HP = dict(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def _chain(impl: str, k: int, interpret: bool, config=None):
  """jit of k chained AdamW updates of (w, mu, nu), which are donated."""
  def f(x, dy, w, mu, nu, hp):
    state = (mu, nu)
    for _ in range(k):
      if impl == "xla":
        w, state = fused_dw_update_reference(x, dy, w, state, hp, rule=ADAMW)
      else:
        w, state = fused_dw_update(x, dy, w, state, hp, rule=ADAMW,
                                   implementation=impl, interpret=interpret,
                                   config=config, in_place=True)
    return (w, *state)
  return jax.jit(f, donate_argnums=(2, 3, 4))


def _per_op_ms(fn, x, dy, carry, hp, k: int, reps: int) -> float:
  carry = fn(x, dy, *carry, hp)
  jax.block_until_ready(carry)
  t0 = time.perf_counter()
  for _ in range(reps):
    carry = fn(x, dy, *carry, hp)
  jax.block_until_ready(carry)
  return (time.perf_counter() - t0) / reps / k * 1e3


def probe(t: int, d_in: int, d_out: int, impls, chain: int, reps: int,
          interpret: bool) -> list[dict]:
  key = jax.random.key(0)
  x = jax.random.normal(key, (t, d_in), jnp.bfloat16)
  dy = jax.random.normal(jax.random.fold_in(key, 1), (t, d_out), jnp.bfloat16)
  hp = ADAMW.pack(HP, 3)

  def fresh():
    w = jax.random.normal(jax.random.fold_in(key, 2), (d_in, d_out))
    mu = 1e-2 * jax.random.normal(jax.random.fold_in(key, 3), (d_in, d_out))
    return w, mu, mu * mu

  want = _chain("xla", chain, False)(x, dy, *fresh(), hp)
  rows = []
  for impl in impls:
    # Interpret mode needs small tiles that divide the smoke-test shapes.
    config = None
    if interpret:
      config = (MosaicConfig(block_m=64, block_n=64, max_concurrent_steps=2)
                if impl == "mosaic" else
                FusedDWConfig(block_m=16, block_n=32, block_t=16, num_stages=1)
                if impl == "triton" else None)
    row = dict(shape=(t, d_in, d_out), implementation=impl)
    try:
      chained = _chain(impl, chain, interpret, config)
      if impl != "xla":
        err = _rel_err(list(chained(x, dy, *fresh(), hp)), list(want))
        row["rel_err"] = err
        if not err <= MAX_REL_ERR:  # NaN included
          raise ValueError(f"differs from the reference: rel err {err:.1e}")
        row["chained_ms"] = _per_op_ms(chained, x, dy, fresh(), hp, chain, reps)
      row["single_ms"] = _per_op_ms(_chain(impl, 1, interpret, config), x, dy,
                                    fresh(), hp, 1, reps)
    except Exception as e:  # pylint: disable=broad-except  # scope, lowering
      row["error"] = str(e).split("\n")[0][:120]
    rows.append(row)
  return rows


def print_table(rows, chain: int) -> None:
  print(f"\n| T | in→out | implementation | 1 op per call ms | {chain} chained in "
        "one jit, ms per op | rel err |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    t, d_in, d_out = r["shape"]
    if "error" in r:
      print(f"| {t} | {d_in}→{d_out} | {r['implementation']} | | | {r['error']} |")
      continue
    chained = f"{r['chained_ms']:.3f}" if "chained_ms" in r else "(not comparable)"
    err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
    print(f"| {t} | {d_in}→{d_out} | {r['implementation']} | "
          f"{r['single_ms']:.3f} | {chained} | {err} |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="512:4096x1024,2048:4096x4096,"
                 "512:4096x14336,8192:4096x1024", help="T:inxout, comma-separated")
  p.add_argument("--implementations", default="xla,triton,mosaic")
  p.add_argument("--chain", type=int, default=8)
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--interpret", action="store_true")
  a = p.parse_args(argv)
  if a.chain < 1 or a.reps < 1:
    raise SystemExit("--chain and --reps must be >= 1")
  shapes = []
  for s in a.shapes.split(","):
    try:
      t, dims = s.split(":")
      d_in, d_out = dims.split("x")
      shape = (int(t), int(d_in), int(d_out))
    except ValueError:
      raise SystemExit(f"--shapes: expected T:INxOUT, got {s!r}") from None
    if min(shape) < 1:
      raise SystemExit(f"--shapes: T, in and out must be >= 1, got {s!r}")
    shapes.append(shape)
  impls = a.implementations.split(",")
  for impl in impls:
    if impl not in ("xla", "triton", "mosaic"):
      raise SystemExit(f"--implementations: unknown {impl!r}")
  rows = [r for shape in shapes
          for r in probe(*shape, impls, a.chain, a.reps, a.interpret)]
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
  print_table(rows, a.chain)
  return rows


if __name__ == "__main__":
  main()
