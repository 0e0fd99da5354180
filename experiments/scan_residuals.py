"""What a scanned Llama step keeps from its forward for its backward, per block.

Traced, not run: the step is traced on abstract values (``jax.eval_shape``,
``jax.make_jaxpr``), so the 8B and 32B presets cost no memory and no device.
For each optimizer and layout it reads the forward loop over the blocks in the
step's jaxpr (the first loop whose length is the block count) and sums its
stacked outputs: the residuals the backward reads. With per-block remat
(``scan+remat``) that is each block's input; a fused ``scan`` row
(``inplace_scan(..., remat=False)`` under
``jax.checkpoint(policy=recompute_elementwise)``) keeps the blocks' matmul
and attention outputs; optax's ``scan`` (``nn.scan`` differentiated by JAX)
keeps every residual ``jax.vjp`` would. Its stacked gradient and the new
weights are not residuals and are not counted here (``memory_llama`` measures
the whole step).

These are sizes in the traced program, before XLA: the compiled step's temp
is ``memory_llama``'s ``memory_analysis()`` column. cuDNN attention cannot be
traced without a GPU, so use ``--attention xla`` or ``einsum``: both keep
fp32 (S, S) scores per head group, which cuDNN's attention does not (it keeps
its output and the softmax statistics).

  python -m experiments.scan_residuals --model llama3.1-8b --tokens 512,2048 \\
      --attention xla
"""

from __future__ import annotations

import argparse

import numpy as np

from experiments import memory_llama

MiB, GiB = 1024**2, 1024**3


def _stacked_outputs(eqn) -> list:
  """A scan equation's stacked outputs (ys), not its carry. jax 0.10 records
  ``num_carry``; jax 0.11 records the outputs' structure as a FlatTree
  ``ft_out`` of (carry, ys)."""
  if "num_carry" in eqn.params:
    return list(eqn.outvars[eqn.params["num_carry"]:])
  _, ys = eqn.params["ft_out"].update(list(eqn.outvars)).unpack()
  return list(ys)


def forward_loop_outputs(closed_jaxpr, length: int) -> list:
  """Avals of the stacked outputs (ys) of the first scan of ``length``
  steps in program order, nested jaxprs (jit, custom_vjp) included."""
  from jax.extend.core import jaxprs_in_params  # pylint: disable=g-import-not-at-top

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scan" and eqn.params["length"] == length:
        return [v.aval for v in _stacked_outputs(eqn)]
      for sub in jaxprs_in_params(eqn.params):
        found = walk(sub)
        if found is not None:
          return found
    return None
  found = walk(closed_jaxpr.jaxpr)
  if found is None:
    raise ValueError(f"no scan of length {length} in the step")
  return found


def measure(model_name: str, tokens: int, optimizer: str, layout: str,
            attention: str = "xla") -> dict:
  """One row: the forward loop's stacked outputs per block, traced with two
  blocks of the preset at full width (every block alike), and their total
  for the preset's block count.

  Raises:
    ValueError: for a layout that does not scan.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import forge_jax as fj
  from forge_jax.models import llama

  if not layout.startswith("scan"):
    raise ValueError(f"layout={layout!r} does not scan; use 'scan' or 'scan+remat'")
  blocks = 2
  cfg, model, batch, tx = memory_llama.build(
      model_name, tokens, optimizer, layout, attention=attention,
      logits_dtype="bfloat16", layers=blocks)
  state = memory_llama.abstract_state(model, tx, jax.random.key(0), batch[0])
  loss_fn = memory_llama.lm_loss(model)
  if optimizer == "optax":
    step = jax.grad(lambda p, b: loss_fn({"params": p}, b))
    jaxpr = jax.make_jaxpr(step)(state.params, batch)
  else:
    jaxpr = jax.make_jaxpr(lambda s, b: fj.fused_step(
        s, b, loss_fn, implementation="xla"))(state, batch)
  avals = forward_loop_outputs(jaxpr, blocks)
  per_block = sum(int(np.prod(a.shape[1:])) * a.dtype.itemsize for a in avals)
  n_layers = llama.get_config(model_name).n_layers
  return dict(model=model_name, tokens=tokens, optimizer=optimizer,
              layout=layout, attention=attention, arrays=len(avals),
              per_block_bytes=per_block, total_bytes=per_block * n_layers,
              n_layers=n_layers)


def print_table(rows: list[dict]) -> None:
  print("| model | T | optimizer | layout | attention | arrays per block "
        "| MiB per block | GiB for all blocks |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} | {r['tokens']} | {r['optimizer']} | {r['layout']} "
          f"| {r['attention']} | {r['arrays']} | {r['per_block_bytes'] / MiB:.1f} "
          f"| {r['total_bytes'] / GiB:.2f} |")


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", default="llama3.1-8b")
  p.add_argument("--tokens", default="512,2048",
                 help="comma-separated tokens per step")
  p.add_argument("--optimizers", default="optax,forge-bf16")
  p.add_argument("--layouts", default="scan,scan+remat")
  p.add_argument("--attention", default="xla", choices=("xla", "einsum"),
                 help="cuDNN's cannot be traced without a GPU")
  args = p.parse_args(argv)
  rows = [measure(args.model, int(t), o, l, args.attention)
          for t in args.tokens.split(",") for o in args.optimizers.split(",")
          for l in args.layouts.split(",")]
  print_table(rows)
  return rows


if __name__ == "__main__":
  main()
