"""Does a model trained by the fused kernels follow the unfused reference?

Builds a ``forge_jax.models.llama`` preset (``--layers`` blocks at full
width, random init with key 0, one batch of ``--tokens`` tokens) and runs
``--steps`` fused steps from that same initial state for each variant, in
one process. A variant is ``IMPL[:fresh][:seedN]``: IMPL is ``xla``,
``auto``, ``mosaic`` or ``triton``; ``fresh``: the kernels write fresh
outputs (``fused_step(in_place=False)``; otherwise in place, as
``make_train_step`` runs them); ``seedN``: the stochastic-rounding seed N
(``TrainState.create(seed=N)``, default 0). The first variant is the
reference. A reference with another seed is the control: it measures how far
two runs that differ only in rounding drift apart, the floor for any
kernel's difference. For every param (and with ``--leaves all`` every
floating state leaf: the moments) the script prints, against the
reference's:

* ``|Δ|/|Δref|``: the norm of the variant's change from the initial value
  over the reference's (1 when both moved alike; 2 for an update applied
  twice; 0 for one lost);
* ``err``: ``|Δ - Δref| / |Δref|``, the relative error of the change (its
  floor is the bf16 rounding of the weights: a ulp flipped on a few
  elements);

and each variant's loss per step, then the loss of its final params. A
scanned model's stacked leaves are compared layer by layer (``layers[i]``).
Cells whose ratio is off 1 by more than 5% or whose ``err`` exceeds
``--tol`` are marked ``<<``. Exit status 1 if any is outside a control
column, or a fused backward ran other than once.

    python -m experiments.check_fused_model --model llama3.1-8b --layers 2 \\
        --tokens 2048 --variants xla,auto,auto:fresh
    python -m experiments.check_fused_model --model cpu-tiny --tokens 64 \\
        --variants xla,mosaic,mosaic:fresh --interpret  # anywhere
"""

from __future__ import annotations

import argparse
import functools
import sys

from experiments import memory_llama

IMPLEMENTATIONS = ("xla", "auto", "mosaic", "triton")


def parse_variant(text: str) -> tuple[str, bool, int]:
  """'auto' -> ('auto', True, 0); 'auto:fresh:seed3' -> ('auto', False, 3)."""
  impl, *mods = text.split(":")
  in_place, seed = True, 0
  for m in mods:
    if m == "fresh":
      in_place = False
    elif m.startswith("seed") and m[4:].isdigit():
      seed = int(m[4:])
    else:
      impl = None
  if not 0 <= seed < 2**32:
    impl = None
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"variant {text!r}: expected IMPL[:fresh][:seedN] with "
                     f"IMPL in {IMPLEMENTATIONS} and 0 <= N < 2**32")
  return impl, in_place, seed


def variant_name(impl: str, in_place: bool, seed: int) -> str:
  return impl + ("" if in_place else ":fresh") + (f":seed{seed}" if seed else "")


def flat_leaves(tree) -> dict:
  """'a/b/c' -> leaf, for params and forge_state alike."""
  import jax  # pylint: disable=g-import-not-at-top
  return {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): v
          for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def _is_float(x) -> bool:
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jnp.issubdtype(x.dtype, jnp.floating)


STACK = "layers/block/"
"""Where a scanned Llama's stacked leaves sit: compared layer by layer, each
reported as ``.../layers[i]/...`` (the unrolled model's ``layers_i``)."""


@functools.lru_cache(maxsize=None)
def _norms():
  """The jitted (|Δref|, |Δ|, |Δ-Δref|) of one leaf (per layer along its
  first axis when ``per_layer``), built once: every variant's comparison
  reuses its compilations."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp

  @functools.partial(jax.jit, static_argnums=3)
  def norms(v0, r, g, per_layer):
    v0 = v0.astype(jnp.float32)
    d_ref, d_got = r.astype(jnp.float32) - v0, g.astype(jnp.float32) - v0
    axes = tuple(range(1 if per_layer else 0, v0.ndim))
    norm = lambda d: jnp.sqrt(jnp.sum(jnp.square(d), axis=axes))  # noqa: E731
    return norm(d_ref), norm(d_got), norm(d_got - d_ref)

  return norms


def compare(initial: dict, ref: dict, got: dict) -> dict:
  """Per float leaf that either run moved: (|Δ|/|Δref|, |Δ-Δref|/|Δref|),
  computed where the arrays are (on the GPU for a model's params); a leaf
  only the variant moved gets (inf, inf). A scanned stack's leaf (its path
  holds ``STACK``) is compared per layer along its first axis."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  norms = _norms()
  out = {}
  for k, v0 in initial.items():
    if not _is_float(v0):
      continue
    per_layer = STACK in k and v0.ndim > 1
    n_ref, n_got, n_diff = (np.atleast_1d(np.asarray(v)) for v in
                            norms(v0, ref[k], got[k], per_layer))
    for i in range(len(n_ref)):
      name = k.replace(STACK, f"layers[{i}]/") if per_layer else k
      if n_ref[i]:
        out[name] = (float(n_got[i] / n_ref[i]), float(n_diff[i] / n_ref[i]))
      elif n_got[i]:  # the reference left it, the variant moved it
        out[name] = (float("inf"), float("inf"))
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--model", default="llama3.1-8b")
  p.add_argument("--layers", type=int, default=2,
                 help="blocks (0: the preset's)")
  p.add_argument("--tokens", type=int, default=2048)
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--layout", default="unrolled+remat",
                 choices=("unrolled", "unrolled+remat", "scan", "scan+remat"))
  p.add_argument("--moments", default="bf16", choices=("bf16", "int8"))
  p.add_argument("--embedding", default="fused", choices=("fused", "unfused"))
  p.add_argument("--variants", default="xla,auto,auto:fresh",
                 help="comma-separated IMPL or IMPL:fresh; the first is the "
                 "reference")
  p.add_argument("--interpret", action="store_true",
                 help="run the Pallas kernels in interpret mode (no GPU)")
  p.add_argument("--leaves", default="all", choices=("all", "params"),
                 help="compare the params and the fused layers' moments, or "
                 "the params only (less device memory: the initial and the "
                 "reference's final leaves are kept there)")
  p.add_argument("--audit", action="store_true",
                 help="the variants after the reference run fused_step(audit="
                 "True): each ForgeDense that is not sharded (not ForgeEmbed; under "
                 "a scan, one line per layer with the stack's name) prints its "
                 "update's distance from "
                 "the reference update on its own inputs, in the same program")
  p.add_argument("--tol", type=float, default=0.1,
                 help="largest err not marked")
  p.add_argument("--attention", default="einsum",
                 choices=("einsum", "xla", "cudnn", "auto"))
  a = p.parse_args(argv)
  try:
    variants = [parse_variant(v) for v in a.variants.split(",")]
  except ValueError as e:
    p.error(f"--variants: {e}")
  if len(variants) < 2:
    p.error("--variants needs a reference and at least one more")
  if all(seed != variants[0][2] for _, _, seed in variants[1:]):
    p.error("--variants: every variant after the reference has another "
            "rounding seed (a control); add one with the reference's seed "
            "to compare a kernel")
  if a.layers < 0 or a.steps < 1 or a.tokens < 1:
    p.error("--layers must be >= 0, --steps and --tokens >= 1")

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp
  import numpy as np

  import forge_jax as fj
  from forge_jax.models import llama

  if a.model not in llama.PRESETS:
    p.error(f"--model={a.model!r}: expected a preset, one of {sorted(llama.PRESETS)}")
  kernels = sorted({impl for impl, _, _ in variants} & {"mosaic", "triton"})
  if kernels and not a.interpret and jax.default_backend() != "gpu":
    p.error(f"--variants {kernels} need a GPU (found {jax.default_backend()!r}) "
            "or --interpret")
  cfg = llama.get_config(a.model)
  if a.layers > cfg.n_layers:
    p.error(f"--layers={a.layers} must be at most {cfg.n_layers}")
  # The model, batch and optimizer as memory_llama builds its fused variants.
  cfg, model, batch, tx = memory_llama.build(
      a.model, a.tokens, f"forge-{a.moments}", a.layout, attention=a.attention,
      logits_dtype="bfloat16", embedding=a.embedding, layers=a.layers)
  unrolled = not cfg.scan_layers

  def make_state(seed):  # the same init every call (key 0)
    if unrolled:  # memory_llama's: from the scanned twin, quicker to compile
      variables = memory_llama._unrolled_init(  # pylint: disable=protected-access
          model, jax.random.key(0), batch[0])
    else:
      variables = jax.jit(model.init)(jax.random.key(0), batch[0])
    return fj.TrainState.create(apply_fn=model.apply, variables=variables,
                                tx=tx, seed=seed)

  def leaves(state):
    tree = {"params": state.params}
    if a.leaves == "all":
      tree["forge_state"] = state.forge_state
    return flat_leaves(tree)

  loss_fn = memory_llama.lm_loss(model)
  final_loss = jax.jit(loss_fn)
  initial = ref = None
  names, rows, bad = [], [], False
  for impl, in_place, seed in variants:
    name = variant_name(impl, in_place, seed)
    step = jax.jit(functools.partial(
        fj.fused_step, loss_fn=loss_fn, implementation=impl,
        interpret=a.interpret, in_place=in_place, order_updates=None,
        audit=a.audit and ref is not None),
        donate_argnums=(0,))
    state = make_state(seed)
    if initial is None:  # copies on the device: the state is donated
      initial = {k: jnp.copy(v) for k, v in leaves(state).items()}
    losses, ok = [], True
    for _ in range(a.steps):
      state, m = step(state, batch)
      losses.append(float(m["loss"]))
      ok &= bool(m["forge_backward_ok"])
    # The loss of the final params (a forward pass only): after one step,
    # what the first update alone did.
    losses.append(float(final_loss(
        {"params": state.params, "forge_state": state.forge_state}, batch)))
    print(f"{name}: loss per step, then after the last "
          + " ".join(f"{v:.5f}" for v in losses)
          + ("" if ok else "  (forge_backward_ok False: a fused backward ran "
             "other than once per kernel)"), flush=True)
    bad |= not ok
    if ref is None:
      ref, ref_name = leaves(state), name
      continue
    control = seed != variants[0][2]
    names.append(name + (" (control)" if control else ""))
    rows.append((control, compare(initial, ref, leaves(state))))
    del state
    worst = max(rows[-1][1].items(), key=lambda kv: abs(kv[1][0] - 1) + kv[1][1])
    print(f"  worst leaf against {ref_name}: {worst[0]} |Δ|/|Δref| "
          f"{worst[1][0]:.3f}, err {worst[1][1]:.3f}", flush=True)

  print(f"\n|Δ|/|Δref| and err = |Δ-Δref|/|Δref| after {a.steps} step(s), "
        f"against {ref_name} ({a.model}, {cfg.n_layers} blocks, T={a.tokens}, "
        f"{a.layout}, {a.moments} moments); << marks ratio off 1 by > 5% or "
        f"err > {a.tol}:")
  print("| leaf | " + " | ".join(names) + " |")
  print("|---|" + "---|" * len(names))
  for k in sorted(set().union(*(r for _, r in rows))):
    cells = []
    for control, row in rows:
      ratio, err = row.get(k, (float("nan"), float("nan")))
      off = not (abs(ratio - 1) <= 0.05 and err <= a.tol)
      bad |= off and not control
      cells.append(f"{ratio:.3f} / {err:.3f}" + (" <<" if off else ""))
    print(f"| {k} | " + " | ".join(cells) + " |")
  print("\nverdict: " + ("DIFFERENT from the reference" if bad
                          else "every variant follows the reference"))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
