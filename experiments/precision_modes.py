"""train_lm under each precision mode of the fused AdamW, one table.

Runs ``experiments.train_lm`` once per mode (each in its own process, so each
peak-memory figure is its own), same preset, seed, data and schedule:

* ``fp32``: fp32 projection kernels, fp32 moments;
* ``bf16+SR``: bf16 projection kernels written back with stochastic rounding;
* ``bf16 RTN``: bf16 projection kernels rounded to nearest (the failure mode
  stochastic rounding fixes: updates below half a bf16 ULP are lost);
* ``int8 moments``: fp32 kernels, AdamW's mu and nu in int8 for every param;
* ``bf16+SR+int8``: both (the leanest mode).

and prints final and best validation loss (and the difference to fp32), the
mean absolute difference of the training loss to the fp32 run, optimizer-state
bytes, median step time and peak device memory.

    python -m experiments.precision_modes --preset 60m --steps 500 --out runs/precision
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from experiments import _runs

MODES = {
    "fp32": [],
    "bf16+SR": ["--param-dtype", "bfloat16"],
    "bf16 RTN": ["--param-dtype", "bfloat16", "--no-stochastic-rounding"],
    "int8 moments": ["--moment-dtype", "int8"],
    "bf16+SR+int8": ["--param-dtype", "bfloat16", "--moment-dtype", "int8"],
}
GiB = 1024**3


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  _runs.add_arguments(p, name="modes", variants=MODES, sep=",",
                      default_out="runs/precision_modes")
  a = p.parse_args(argv)
  results = _runs.run_selected(a, name="modes", variants=MODES, sep=",")

  base = results.get("fp32")
  print("\n" + _runs.describe(next(iter(results.values()))))
  print("| mode | final val loss | Δ vs fp32 | best val loss | mean abs Δ train loss "
        "vs fp32 | optimizer state MiB | median step ms | peak GiB |")
  print("|---|---|---|---|---|---|---|---|")
  base_loss = ({r["step"]: r["loss"] for r in base["records"]} if base else {})
  rows = []
  for mode, m in results.items():
    s = m["summary"]
    d = (s["final_val_loss"] - base["summary"]["final_val_loss"]) if base else float("nan")
    vals = [r["val_loss"] for r in m["records"] if "val_loss" in r]
    common = [r for r in m["records"] if r["step"] in base_loss]
    track = (float(np.mean([abs(r["loss"] - base_loss[r["step"]]) for r in common]))
             if common else float("nan"))
    rows.append(dict(mode=mode, final_val_loss=s["final_val_loss"], delta=d,
                     best_val_loss=min(vals), mean_abs_dloss=track,
                     state_bytes=m["optimizer_state_bytes"],
                     step_ms=1e3 * s["median_step_s"], peak_bytes=s["peak_bytes"]))
    peak = f"{s['peak_bytes'] / GiB:.2f}" if s["peak_bytes"] else "n/a"
    print(f"| {mode} | {s['final_val_loss']:.4f} | {d:+.4f} | {min(vals):.4f} | "
          f"{track:.4f} | {m['optimizer_state_bytes'] / 2**20:.1f} | "
          f"{1e3 * s['median_step_s']:.1f} | {peak} |")
  with open(os.path.join(a.out, "precision_modes.json"), "w") as f:
    json.dump(rows, f, indent=1)
  return rows


if __name__ == "__main__":
  main()
