"""Compares train_lm runs step by step (fused vs unfused from the same seed).

    python -m experiments.compare_runs runs/forge runs/optax

The last run given is the baseline. Prints one table: mean and max |Δloss|
per step against it (all steps, and the first ``--windows`` steps), mean
|Δ validation loss| over the evaluations, median step time, tokens/s, peak
device memory and the final training and validation loss.

Two runs of the same configuration give the floor that any comparison sits
on (GPU scatter-adds, e.g. the embedding gradient, sum in a run-dependent
order): compare a fused run and a repeat of the unfused one against the same
baseline.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

GiB = 1024**3

# Config fields that decide which tokens each step sees.
SAME_DATA = ("seed", "batch_size", "seq_len", "tokenizer", "corpus",
             "text_files", "val_fraction")


def load(run_dir: str) -> dict:
  with open(os.path.join(run_dir, "metrics.json")) as f:
    return json.load(f)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("runs", nargs="+", help="run directories; the last is the baseline")
  p.add_argument("--windows", default="10,50",
                 help="comma-separated step counts: also mean |Δloss| over "
                 "steps 1..n")
  a = p.parse_args(argv)
  try:
    windows = [int(w) for w in a.windows.split(",") if w]
  except ValueError:
    p.error(f"--windows {a.windows!r}: expected comma-separated step counts")
  if any(w < 1 for w in windows):
    p.error(f"--windows {a.windows!r}: step counts must be positive")
  runs = [load(r) for r in a.runs]
  base = runs[-1]
  # A step-by-step comparison means something only on the same data stream.
  for path, m in zip(a.runs[:-1], runs[:-1]):
    differ = [f"{k}={m['config'].get(k)!r} (baseline {base['config'].get(k)!r})"
              for k in SAME_DATA if m["config"].get(k) != base["config"].get(k)]
    if differ:
      print(f"note: {path} differs from the baseline in " + ", ".join(differ)
            + ": its batches are not the baseline's")
  def curve(m, key):
    return {r["step"]: r[key] for r in m["records"] if key in r}

  def abs_diffs(a, b):  # step -> |a - b| over the steps both recorded
    return {s: abs(a[s] - b[s]) for s in sorted(set(a) & set(b))}

  def mean(d, upto=None):
    v = [x for s, x in d.items() if upto is None or s <= upto]
    return float(np.mean(v)) if v else float("nan")

  base_loss, base_val = curve(base, "loss"), curve(base, "val_loss")
  rows = []
  longest = 0  # the last step any run shares with the baseline
  for path, m in zip(a.runs, runs):
    diff = abs_diffs(curve(m, "loss"), base_loss)
    longest = max(longest, max(diff, default=0))
    s = m["summary"]
    rows.append({
        "run": path, "optimizer": m["config"]["optimizer"], "steps": len(diff),
        "mean_abs_dloss": mean(diff),
        "max_abs_dloss": max(diff.values(), default=float("nan")),
        "mean_abs_dloss_first": {w: mean(diff, w) for w in windows},
        "mean_abs_dval_loss": mean(abs_diffs(curve(m, "val_loss"), base_val)),
        "median_step_ms": (None if s["median_step_s"] is None
                           else 1e3 * s["median_step_s"]),
        "tokens_per_s": s["median_tokens_per_s"],
        "peak_gib": (s["peak_bytes"] or float("nan")) / GiB,
        "final_loss": s["final_loss"], "final_val_loss": s["final_val_loss"],
    })
  print(f"\nbaseline: {a.runs[-1]} ({base['config']['optimizer']}); "
        f"{base['num_params'] / 1e6:.1f}M params, {base['device']}, jax {base['jax']}")
  # A window longer than every comparison is labelled by the steps it
  # really covers (a 5-step run's "1-50" mean is over steps 1-5).
  label = {w: f"1-{w}" if w <= longest else f"1-{longest} (of window {w})"
           for w in windows}
  print("| run | optimizer | steps compared | "
        + "".join(f"mean abs dloss {label[w]} | " for w in windows)
        + "mean abs dloss | max abs dloss | mean abs dval loss | "
        "median step ms | tokens/s | peak GiB | final loss | final val loss |")
  print("|---|---|---|" + "---|" * (len(windows) + 3) + "---|---|---|---|---|")
  def fmt(v, spec):  # "-" for a value the run never reached (None)
    return "-" if v is None else format(v, spec)

  for r in rows:
    first = "".join(f"{r['mean_abs_dloss_first'][w]:.2e} | " for w in windows)
    print(f"| {r['run']} | {r['optimizer']} | {r['steps']} | {first}"
          f"{r['mean_abs_dloss']:.2e} | {r['max_abs_dloss']:.2e} | "
          f"{r['mean_abs_dval_loss']:.2e} | "
          f"{fmt(r['median_step_ms'], '.1f')} | {fmt(r['tokens_per_s'], ',.0f')} | "
          f"{r['peak_gib']:.2f} | {fmt(r['final_loss'], '.4f')} | "
          f"{fmt(r['final_val_loss'], '.4f')} |")
  return rows


if __name__ == "__main__":
  main()
