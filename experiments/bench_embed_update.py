"""The embedding's optimizer step: fused (ForgeEmbed) against unfused.

For a (V, D) table looked up by N tokens, times and sizes, in one run:

* ``unfused``: what ``jax.grad`` of the lookup and an optax-style update
  do: the dense (V, D) gradient (scatter-add of dY into zeros, in the
  table's dtype), then AdamW on every element in one expression (not
  ``fj.adamw``'s own int8 update, which re-quantizes a large leaf in slabs
  of rows);
* ``unfused, fj.adamw``: the dense gradient, then ``forge_jax.adamw``'s own
  unfused update (int8 states of a large leaf re-quantized in slabs of
  rows), the direction applied to the table;
* ``fused, one pass``: :func:`forge_jax._src.embed.fused_embed_update` with
  ``slab_rows=None`` (each row's gradient row gathered inside the update
  from the N rows of dE and a zero row);
* ``fused, slabs``: the default ``slab_rows='auto'`` (int8 states of a large
  table in slabs of 2**24 elements, after the table's one pass);

each jitted with the table and moments donated, checked against the one-hot
reference, and reported with XLA's temp size and the bytes floor (read and
write the table and the moments once, at ``--bandwidth`` GB/s).

    python -m experiments.bench_embed_update            # Llama-3.1-8B's table
    python -m experiments.bench_embed_update --vocab 4096 --dim 256 --tokens 64

Prints a markdown table last. Made for the GPU: on XLA's CPU backend the
temp column shows no saving (it keeps the one pass's gathered gradient in
fp32) and the floor column, at the H200's default bandwidth, means nothing.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

import forge_jax as fj
from forge_jax._src import embed as embed_lib
from pallas_kernels import quantization


def _state(opt, shape, key):
  init = opt.init_state(shape)
  out = []
  for i, name in enumerate(opt.rule.state_names):
    x = jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) * 1e-3
    if name in opt.rule.nonnegative_states:
      x = jnp.abs(x)
    out.append(quantization.state_from_f32(x, init[name]))
  return tuple(out)


def dense_gradient_update(ids, dy, table, state, hparams, *, rule):
  """The unfused baseline: what ``jax.grad`` of the lookup gives (the dense
  (V, D) gradient, scatter-added in the table's dtype), then ``rule`` on
  every element in one expression."""
  hp, count = rule.unpack(hparams)
  grad = jnp.zeros(table.shape, table.dtype).at[ids].add(dy)
  new_w, new_state = rule.update(
      grad.astype(jnp.float32), table.astype(jnp.float32),
      tuple(quantization.state_to_f32(s) for s in state), hp, count)
  return new_w.astype(table.dtype), tuple(
      quantization.state_from_f32(x, s) for x, s in zip(new_state, state))


def run(vocab: int, dim: int, tokens: int, moments: str, reps: int,
        bandwidth: float, check: bool) -> list[dict]:
  opt = fj.adamw(1e-3, mu_dtype=moments, nu_dtype=moments)
  key = jax.random.key(0)
  table = jax.random.normal(key, (vocab, dim), jnp.bfloat16)
  state = _state(opt, (vocab, dim), key)
  ids = jax.random.randint(jax.random.fold_in(key, 7), (tokens,), 0, vocab)
  dy = jax.random.normal(jax.random.fold_in(key, 8), (tokens, dim), jnp.bfloat16)
  hparams = opt.packed_hyperparams(jnp.int32(5))
  seed = jnp.uint32(3)
  unfused = functools.partial(dense_gradient_update, hparams=hparams,
                              rule=opt.rule)

  fused = functools.partial(embed_lib.fused_embed_update, hparams=hparams,
                            rule=opt.rule, seed=seed)
  one_pass = functools.partial(fused, slab_rows=None)
  tx = fj.adamw(1e-3, mu_dtype=moments, nu_dtype=moments)

  def unfused_tx(ids, dy, table, state):
    grad = jnp.zeros(table.shape, table.dtype).at[ids].add(dy)
    first, *rest = tx.init(jax.ShapeDtypeStruct(table.shape, table.dtype))
    first = first._replace(count=jnp.asarray(4, jnp.int32),
                           **dict(zip(opt.rule.state_names, state)))
    updates, (first, *_) = tx.update(grad, (first, *rest), table)
    return ((table.astype(jnp.float32) + updates.astype(jnp.float32)
             ).astype(table.dtype),
            tuple(getattr(first, n) for n in opt.rule.state_names))
  moved = table.nbytes + sum(x.nbytes for x in jax.tree.leaves(state))
  floor_ms = 2 * moved / (bandwidth * 1e9) * 1e3
  rows = []
  for name, f in (("unfused", unfused), ("unfused, fj.adamw", unfused_tx),
                  ("fused, one pass", one_pass), ("fused, slabs", fused)):
    jf = jax.jit(f, donate_argnums=(2, 3))
    compiled = jf.lower(ids, dy, table, state).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    err = None
    if check and name.startswith("fused"):
      out = jax.jit(f)(ids, dy, table, state)
      ref = jax.jit(functools.partial(
          embed_lib.fused_embed_update_reference, hparams=hparams,
          rule=opt.rule, seed=seed))(ids, dy, table, state)
      err = float(jnp.max(jnp.abs(out[0].astype(jnp.float32)
                                  - ref[0].astype(jnp.float32))))
      del out, ref
    w, s = jnp.copy(table), jax.tree.map(jnp.copy, state)
    w, s = compiled(ids, dy, w, s)  # warm-up
    jax.block_until_ready(w)
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      w, s = compiled(ids, dy, w, s)
      jax.block_until_ready(w)
      times.append(time.perf_counter() - t0)
    ms = float(np.median(times)) * 1e3
    rows.append(dict(variant=name, vocab=vocab, dim=dim, tokens=tokens,
                     moments=moments, ms=ms, floor_ms=floor_ms,
                     temp_bytes=int(temp), max_abs_err_w=err))
    del w, s
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--vocab", type=int, default=128256)
  p.add_argument("--dim", type=int, default=4096)
  p.add_argument("--tokens", type=int, default=2048)
  p.add_argument("--moments", default="int8,bfloat16")
  p.add_argument("--reps", type=int, default=20)
  p.add_argument("--bandwidth", type=float, default=4300.0,
                 help="GB/s for the bytes floor (H200: ~4300)")
  p.add_argument("--no-check", action="store_true")
  a = p.parse_args(argv)
  rows = []
  for m in a.moments.split(","):
    rows += run(a.vocab, a.dim, a.tokens, m, a.reps, a.bandwidth, not a.no_check)
  print(f"\n{jax.devices()[0].device_kind}, jax {jax.__version__}")
  print("| V × D, N tokens | moments | variant | ms | floor ms | temp MiB | "
        "max |Δw| vs one-hot reference |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    err = "" if r["max_abs_err_w"] is None else f"{r['max_abs_err_w']:.2e}"
    print(f"| {r['vocab']} × {r['dim']}, {r['tokens']} | {r['moments']} | "
          f"{r['variant']} | {r['ms']:.3f} | {r['floor_ms']:.3f} | "
          f"{r['temp_bytes'] / 2**20:.1f} | {err} |")


if __name__ == "__main__":
  main()
