"""Pretrain the same Llama-style model with several optimizers, one table.

The optimizers a JAX user would otherwise pick, against FOAM's fold_adam
(``train_lm --optimizer`` names; each in its own process):

* ``adamw``: ``optax.adamw`` (the baseline);
* ``fold-adam l=2/3/4``: FOAM's recipe (``forge_jax.hybrid_fold_adam``):
  fold_adam on the attention and MLP matrices, AdamW on embeddings and norms,
  with the authors' α = 0.25 on the folded group and twice AdamW's learning
  rate (``--learning-rate-scale 2``; the authors likewise run FOAM at a larger
  lr than Adam). Tuned on the H200 (60m, 500 steps, mixed corpus): l=3 at
  α = 0.25 ended at 4.979 / 4.894 / 4.916 validation loss for lr 1.5e-3 /
  3e-3 / 6e-3, where AdamW ended at 4.912 / 4.912 (and 4.930 repeated) /
  5.024 for lr 1e-3 / 1.5e-3 / 3e-3; at lr 1.5e-3, α = 0.125 / 0.5 / 1 gave
  5.106 / 5.053 / 5.258 (``results/h200_2026-11-30c/``,
  ``results/h200_2026-12-01/``). ``-- --fold-scale X`` overrides α;
* ``fold-adam l=3, int8 moments``: the same with every group's moments int8
  (``--moment-dtype int8``): 14% of AdamW's state at 60M;
* ``fold-adam l=3, embedding folded``: the embedding (the tied head) folded
  too, so that every matrix keeps 2/2^l of Adam's state (the paper keeps
  it on AdamW; at 60M it holds 45% of the parameters);
* ``fold-adam l=3, no residual``: the ablation without R;
* ``forge fold-adam l=3 (fused)``: the same FOAM run inside the fused
  kernels (FORGE's epilogue), which should track the unfused l=3 run;
* ``adafactor``: ``optax.adafactor``;
* ``muon``: ``optax.contrib.muon`` on the matrices, AdamW elsewhere.

Same model, data order, schedule and token budget. Prints final validation
loss and perplexity, optimizer-state bytes (and the saving against AdamW),
median step time, and plots the validation curves (``val_curves.png``).

    python -m experiments.compare_optimizers --preset 60m --steps 1000 \\
        --out runs/compare -- --corpus mixed
"""

from __future__ import annotations

import argparse
import json
import math
import os

from experiments import _runs

# α = 0.25 on the folded group, twice AdamW's learning rate (see above).
FOAM = ["--fold-scale", "0.25", "--learning-rate-scale", "2"]
OPTIMIZERS = {
    "adamw": ["--optimizer", "optax-adamw"],
    "fold-adam l=2": ["--optimizer", "fold-adam", "--fold-level", "2", *FOAM],
    "fold-adam l=3": ["--optimizer", "fold-adam", "--fold-level", "3", *FOAM],
    "fold-adam l=4": ["--optimizer", "fold-adam", "--fold-level", "4", *FOAM],
    "fold-adam l=3, int8 moments": ["--optimizer", "fold-adam", "--fold-level",
                                    "3", *FOAM, "--moment-dtype", "int8"],
    "fold-adam l=3, embedding folded": ["--optimizer", "fold-adam",
                                        "--fold-level", "3", *FOAM,
                                        "--fold-embeddings"],
    "fold-adam l=3, no residual": ["--optimizer", "fold-adam-noresidual",
                                   "--fold-level", "3", *FOAM],
    "forge fold-adam l=3 (fused)": ["--optimizer", "forge-fold-adam",
                                    "--fold-level", "3", *FOAM],
    "adafactor": ["--optimizer", "adafactor"],
    "muon": ["--optimizer", "muon"],
}


def _plot(results: dict[str, dict], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for name, m in results.items():
    val = [r for r in m["records"] if "val_loss" in r]
    ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "-", lw=1.5,
            label=name)
  ax.set_xlabel("step")
  ax.set_ylabel("validation cross-entropy (nats/token)")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  _runs.add_arguments(p, name="optimizers", variants=OPTIMIZERS, sep="|",
                      default_out="runs/compare_optimizers")
  a = p.parse_args(argv)
  results = _runs.run_selected(a, name="optimizers", variants=OPTIMIZERS, sep="|")
  header = _runs.describe(next(iter(results.values())))
  base = results.get("adamw")
  print("\n" + header)
  print("| optimizer | final val loss | val perplexity | Δ vs adamw (nats) | "
        "optimizer state MiB | state vs adamw | median step ms |")
  print("|---|---|---|---|---|---|---|")
  rows = []
  for name, m in results.items():
    s = m["summary"]
    state = m["optimizer_state_bytes"]
    d = s["final_val_loss"] - base["summary"]["final_val_loss"] if base else math.nan
    ratio = state / base["optimizer_state_bytes"] if base else math.nan
    rows.append(dict(optimizer=name, final_val_loss=s["final_val_loss"],
                     perplexity=math.exp(s["final_val_loss"]), delta=d,
                     state_bytes=state, state_ratio=ratio,
                     step_ms=1e3 * s["median_step_s"]))
    print(f"| {name} | {s['final_val_loss']:.4f} | {math.exp(s['final_val_loss']):.2f} | "
          f"{d:+.4f} | {state / 2**20:.1f} | {100 * ratio:.1f}% | "
          f"{1e3 * s['median_step_s']:.1f} |")
  os.makedirs(a.out, exist_ok=True)
  _plot(results, os.path.join(a.out, "val_curves.png"), header)
  with open(os.path.join(a.out, "compare_optimizers.json"), "w") as f:
    json.dump({"setup": header, "rows": rows}, f, indent=1)
  return rows


if __name__ == "__main__":
  main()
