"""Host cost per step of a train state's pytree: optax's against forge's.

A step waited for one at a time pays the host's work of dispatching it: one
PjRt buffer per leaf of the state, each donated and aliased to an output.
The fused state has more leaves than optax's (every ForgeDense and
ForgeEmbed keeps a float32 ``probe`` and a uint32 ``rounding_seed`` scalar
beside its moments), so this times a donated jitted step whose body only
adds 1 to every leaf, for the real state's tree of each variant
(``memory_llama.build`` through ``jax.eval_shape``) with every array
shrunk to one element per dimension, so the model's kernels are not in it.
The step's adds are device work too, and XLA fuses them per tree as it
chooses: a difference between two rows is the difference of these toy
steps, not a measured host cost per leaf, nor what packing the scalars in
a real state would save.

Variants per layout: ``optax``, ``forge-bf16``, ``forge-int8``, and
``forge-bf16, no scalars`` (the same tree without its ``probe`` and
``rounding_seed`` leaves, which stand for a state that kept them packed in
two arrays of one element per kernel: those two arrays are added).

    python -m experiments.state_dispatch --model llama3.1-8b --steps 200

Prints one markdown table last: leaves, scalar leaves, the median of steps
waited for one by one (on one output, as ``memory_llama`` waits on the
loss), and the mean of steps dispatched back to back (ms), each the median
over ``--repeats`` runs. Stop 33's table (``results/h200_2026-12-03h``) came
from the first version, which waited on every output and ran once.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import memory_llama

_SCALARS = ("probe", "rounding_seed")


def state_shapes(model_name: str, optimizer: str, layout: str):
  """The train state's tree of ShapeDtypeStructs (``jax.eval_shape``)."""
  import forge_jax as fj  # pylint: disable=g-import-not-at-top
  _, model, batch, tx = memory_llama.build(model_name, 64, optimizer, layout,
                                           logits_dtype="bfloat16")

  def make(key, tokens):
    return fj.TrainState.create(apply_fn=model.apply,
                                variables=model.init(key, tokens), tx=tx)
  return jax.eval_shape(make, jax.random.key(0), batch[0])


def _name(path) -> str | None:
  """The last key of a leaf's path (a dict key or a dataclass field)."""
  return getattr(path[-1], "key", getattr(path[-1], "name", None))


def scalar_count(shapes) -> int:
  """Leaves named ``probe`` or ``rounding_seed`` in the tree."""
  return sum(_name(p) in _SCALARS
             for p, _ in jax.tree_util.tree_flatten_with_path(shapes)[0])


def tiny_leaves(shapes, drop_scalars: bool = False) -> list[jax.Array]:
  """One small array per leaf (one element per dimension, same dtype).

  With ``drop_scalars`` the ``probe`` and ``rounding_seed`` leaves are left
  out and two arrays with one element per dropped pair are added instead.
  """
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  out, dropped = [], 0
  for path, s in flat:
    if drop_scalars and _name(path) in _SCALARS:
      dropped += 1
      continue
    dtype = s.dtype if jnp.issubdtype(s.dtype, jnp.number) else jnp.uint32
    out.append(jnp.ones((1,) * len(s.shape), dtype))
  if drop_scalars:
    n = max(dropped // 2, 1)
    out += [jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.uint32)]
  return out


def time_step(leaves: list[jax.Array], steps: int) -> tuple[float, float]:
  """(median waited ms, mean back-to-back ms) of a donated add-one step.

  A waited step waits on its first output only (one execution makes them
  all). The leaves are donated: ``leaves`` is consumed.
  """
  step = jax.jit(lambda ls: [x + jnp.ones((), x.dtype) for x in ls],
                 donate_argnums=(0,))
  for _ in range(3):
    leaves = step(leaves)
  jax.block_until_ready(leaves)
  waited = []
  for _ in range(steps):
    t0 = time.perf_counter()
    leaves = step(leaves)
    jax.block_until_ready(leaves[0])
    waited.append(time.perf_counter() - t0)
  t0 = time.perf_counter()
  for _ in range(steps):
    leaves = step(leaves)
  jax.block_until_ready(leaves)
  return float(np.median(waited)) * 1e3, (time.perf_counter() - t0) / steps * 1e3


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="llama3.1-8b",
                 help="a forge_jax.models.llama preset (default llama3.1-8b)")
  p.add_argument("--layouts", default="unrolled+remat,scan+remat",
                 help="comma-separated memory_llama layouts")
  p.add_argument("--steps", type=int, default=200,
                 help="steps timed each way (default 200)")
  p.add_argument("--repeats", type=int, default=3,
                 help="runs per variant, interleaved; each figure is their "
                 "median (default 3)")
  a = p.parse_args(argv)
  if a.steps < 1:
    p.error(f"--steps={a.steps} must be >= 1")
  if a.repeats < 1:
    p.error(f"--repeats={a.repeats} must be >= 1")
  layouts = a.layouts.split(",")
  for layout in layouts:
    if layout not in memory_llama.LAYOUTS:
      p.error(f"--layouts: {layout!r} is not one of {memory_llama.LAYOUTS}")
  variants = (("optax", "optax", False), ("forge-bf16", "forge-bf16", False),
              ("forge-int8", "forge-int8", False),
              ("forge-bf16, no scalars", "forge-bf16", True))
  rows = []
  for layout in layouts:
    trees = {name: state_shapes(a.model, opt, layout)
             for name, opt, _ in variants}
    runs = {name: [] for name, _, _ in variants}
    n_leaves = {}
    for _ in range(a.repeats):  # interleaved, so drift hits every variant
      for name, _, drop in variants:
        leaves = tiny_leaves(trees[name], drop_scalars=drop)
        n_leaves[name] = len(leaves)  # before time_step consumes them
        runs[name].append(time_step(leaves, a.steps))
    for name, _, drop in variants:
      waited, piped = np.median(np.array(runs[name]), axis=0)
      rows.append((layout, name, n_leaves[name],
                   0 if drop else scalar_count(trees[name]),
                   float(waited), float(piped)))
      print(rows[-1], flush=True)
  print(f"\n{a.model} on {jax.devices()[0].device_kind}: a donated step that "
        f"adds 1 to each leaf of the state's tree (leaves shrunk); median of "
        f"{a.repeats} runs of {a.steps} steps each way\n")
  print("| layout | state | leaves | probe + seed leaves | waited ms | "
        "back to back ms |")
  print("|---|---|---|---|---|---|")
  for layout, name, n, ns, w, pp in rows:
    print(f"| {layout} | {name} | {n} | {ns} | {w:.3f} | {pp:.3f} |")


if __name__ == "__main__":
  main()
