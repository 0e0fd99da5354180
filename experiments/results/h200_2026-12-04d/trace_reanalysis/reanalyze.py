"""Stop 39: stop 38's T=512 traces read again (CPU only).

For the default tile's trace (one CTA per tile) and the persistent tile's
(a41339b): how many CTAs are alive and in each region across the whole GPU
over time, and, per multiprocessor, the gap between a CTA's last event and
the next CTA's first, for several assumed SM clocks (the trace holds each
CTA's start time from the global timer and its events in SM cycles).

    PYTHONPATH=. python experiments/results/h200_2026-12-04d/trace_reanalysis/reanalyze.py
"""
import collections
import json
import os

import numpy as np

from experiments.trace_mosaic import cta_regions

HERE = os.path.dirname(os.path.abspath(__file__))
C = os.path.join(HERE, "..", "..", "h200_2026-12-04c")
DEFAULT = os.path.join(C, "call1_trace_stream/traces/T_512_4096x14336_bf16-sr_adamw_default_tile/forge_fused_dw_adamw_mosaic-1796391134083119053-trace.json")
PERSISTENT = os.path.join(C, "call2_persistent_stream/traces/T_512_4096x14336_bf16-sr_adamw_m128n128t64s3noTP_tile/forge_fused_dw_adamw_mosaic-1796391740032111888-trace.json")


def ctas(path, clock_ghz):
  return cta_regions(json.load(open(path)), clock_ghz)


def over_time(cs, step_us=5.0):
  t0 = min(r[0][1] for _, r in cs)
  t1 = max(r[-1][2] for _, r in cs)
  print(f"span {t1 - t0:.1f} us")
  print("t (us) | CTAs alive | in token loop | in epilogue")
  for x in np.arange(t0, t1, step_us):
    alive = sum(1 for _, r in cs if r[0][1] <= x < r[-1][2])
    tl = sum(1 for _, r in cs for n, b, e in r if n == "token_loop" and b <= x < e)
    ep = sum(1 for _, r in cs for n, b, e in r if n == "epilogue" and b <= x < e)
    print(f"{x - t0:6.1f} | {alive:3d} | {tl:3d} | {ep:3d}")


def gaps(path):
  print("clock GHz | CTAs starting before a slot is free | gap from the latest free slot to the next CTA's start, us (5th/50th/95th pct)")
  for ghz in (1.2, 1.4, 1.6, 1.7, 1.8, 1.98):
    by = collections.defaultdict(list)
    for pid, r in ctas(path, ghz):
      by[pid].append((r[0][1], r[-1][2]))
    early, gs = 0, []
    for rows in by.values():
      rows.sort()
      for k in range(2, len(rows)):  # two CTAs resident per multiprocessor
        s = rows[k][0]
        ended = sorted(e for _, e in rows[:k] if e <= s + 0.05)
        if len(ended) < k - 1:
          early += 1
        else:
          gs.append(s - ended[-1])
    pct = np.percentile(gs, [5, 50, 95]) if gs else []
    print(f"{ghz} | {early} | " + " / ".join(f"{v:.1f}" for v in pct))


if __name__ == "__main__":
  for name, path in (("default tile", DEFAULT), ("persistent tile (a41339b)", PERSISTENT)):
    print(f"== {name}")
    cs = ctas(path, 1.98)
    over_time(cs)
    tl = [e - b for _, r in cs for n, b, e in r if n == "token_loop"]
    ep = [e - b for _, r in cs for n, b, e in r if n == "epilogue"]
    print(f"token loop median {np.median(tl):.2f} us, epilogue median {np.median(ep):.2f} us (at 1.98 GHz)")
  print("== default tile: gaps between CTAs on a multiprocessor")
  gaps(DEFAULT)
