"""Stop 40, on the CPU: did the start delay put the two CTAs of a multiprocessor
out of step, and did they stay so? From the kept traces (this folder's and
call 1's), per trace: how much later the second CTA of each multiprocessor
starts its first token loop than the first (µs, percentiles 10/50/90 over
the 132 multiprocessors), and the share of token-loop time during which
another CTA on the same multiprocessor is in its token loop too ("in step"),
by 50 µs window from the kernel's first token loop. Clock 1.98 GHz, as
trace_mosaic. Run from the repository root:

    python experiments/results/h200_2026-12-04e/call2_spin_delay/offsets.py
"""
import collections
import glob
import gzip
import json
import os

import numpy as np

from experiments import trace_mosaic as tm

HERE = os.path.dirname(os.path.abspath(__file__))


def report(path):
  with gzip.open(path, "rt") as f:
    regs = tm.cta_regions(json.load(f), 1.98)
  by_sm = collections.defaultdict(list)
  for pid, rows in regs:
    by_sm[pid].append([(n, b, e) for n, b, e in rows if n == "token_loop"])
  t0 = min(r[0][1] for ctas in by_sm.values() for r in ctas if r)
  gaps, windows = [], collections.defaultdict(lambda: [0.0, 0.0])
  for ctas in by_sm.values():
    firsts = sorted(r[0][1] for r in ctas if r)
    gaps.append(firsts[1] - firsts[0])
    for i, mine in enumerate(ctas):
      others = tm._union([(b, e) for j, c in enumerate(ctas) if j != i
                          for _, b, e in c])
      for _, b, e in mine:
        w = windows[int((b - t0) // 50)]
        w[0] += e - b
        w[1] += tm._overlap([(b, e)], others)
  label = os.path.basename(os.path.dirname(path))
  print(f"{os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))} {label}: "
        f"second CTA's first token loop later by (µs, p10/p50/p90) "
        f"{np.percentile(gaps, [10, 50, 90]).round(2).tolist()}; in step by 50 µs window: "
        f"{[round(windows[k][1] / windows[k][0], 2) for k in sorted(windows)]}")


for p in sorted(glob.glob(os.path.join(HERE, "..", "call*", "traces", "*", "*.json.gz"))):
  report(p)
