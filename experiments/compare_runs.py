"""Compares train_lm runs step by step (fused vs unfused from the same seed).

    python -m experiments.compare_runs runs/forge runs/optax

The last run given is the baseline. Prints one table: mean and max |Δloss|
per step against it, median step time, tokens/s, peak device memory and the
final training and validation loss.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

GiB = 1024**3


def load(run_dir: str) -> dict:
  with open(os.path.join(run_dir, "metrics.json")) as f:
    return json.load(f)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("runs", nargs="+", help="run directories; the last is the baseline")
  a = p.parse_args(argv)
  runs = [load(r) for r in a.runs]
  base = runs[-1]
  base_loss = {r["step"]: r["loss"] for r in base["records"]}
  rows = []
  for path, m in zip(a.runs, runs):
    loss = {r["step"]: r["loss"] for r in m["records"]}
    common = sorted(set(loss) & set(base_loss))
    diff = np.abs([loss[s] - base_loss[s] for s in common]) if common else np.array([np.nan])
    s = m["summary"]
    rows.append({
        "run": path, "optimizer": m["config"]["optimizer"], "steps": len(common),
        "mean_abs_dloss": float(diff.mean()), "max_abs_dloss": float(diff.max()),
        "median_step_ms": 1e3 * s["median_step_s"],
        "tokens_per_s": s["median_tokens_per_s"],
        "peak_gib": (s["peak_bytes"] or float("nan")) / GiB,
        "final_loss": s["final_loss"], "final_val_loss": s["final_val_loss"],
    })
  print(f"\nbaseline: {a.runs[-1]} ({base['config']['optimizer']}); "
        f"{base['num_params'] / 1e6:.1f}M params, {base['device']}, jax {base['jax']}")
  print("| run | optimizer | steps compared | mean abs dloss | max abs dloss | "
        "median step ms | tokens/s | peak GiB | final loss | final val loss |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['run']} | {r['optimizer']} | {r['steps']} | {r['mean_abs_dloss']:.2e} | "
          f"{r['max_abs_dloss']:.2e} | {r['median_step_ms']:.1f} | {r['tokens_per_s']:,.0f} | "
          f"{r['peak_gib']:.2f} | {r['final_loss']:.4f} | {r['final_val_loss']:.4f} |")
  return rows


if __name__ == "__main__":
  main()
