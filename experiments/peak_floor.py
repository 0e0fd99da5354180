"""What a ``memory_llama`` row's live peak holds beyond its step.

A row's ``peak_bytes`` is the process's ``peak_bytes_in_use`` high-water
mark after its steps. If the step set it, the peak is the step's arguments
plus at most its temp (``memory_analysis()``). This reads rows (their JSON
files, or a folder searched for ``memory_*.json``) and, per model, T and
optimizer family ('optax' or 'forge'), splits them three ways:

- ``peak <= args + temp``: the step's own peak (up to 1 MiB);
- above it, and initialization's peak (``init_peak_bytes``) as high: set by
  the init (rows before stop 24's unrolled init);
- above it otherwise: set by something outside the step's buffers.

For the last group it prints the distinct values of peak − args with their
counts and the temps under them: the same value whatever the temp is a
floor the step did not set. Beside it, the bytes of the head's forward
matmul that an autotuner timing it would hold (``x`` T × D, the kernel
D × V, and two T × V outputs in the logits' dtype, bf16 unless the row
says float32), and what the floor holds beyond those.

Usage::

  python -m experiments.peak_floor experiments/results [--model llama3.1-8b]

Only single-device rows (``tp`` = 1) with a live peak (GPU runs) are read.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os

GiB = 2**30
MiB = 2**20


def read_rows(paths) -> list[dict]:
  """``memory_llama`` rows from JSON files, or folders searched for them."""
  files = []
  for p in paths:
    files += (sorted(glob.glob(os.path.join(p, "**", "memory_*.json"),
                               recursive=True)) if os.path.isdir(p) else [p])
  rows = []
  for f in files:
    with open(f) as fh:
      try:
        data = json.load(fh)
      except json.JSONDecodeError:
        continue  # a file cut by a time limit
    for r in data if isinstance(data, list) else [data]:
      if (isinstance(r, dict) and r.get("peak_bytes") is not None
          and "temp_size_in_bytes" in r and r.get("tp", 1) == 1):
        rows.append(r)
  return rows


def head_matmul_bytes(row: dict) -> int | None:
  """Bytes of the head's forward matmul's operands and two outputs, or None
  for a model preset this does not know."""
  from forge_jax.models import llama  # pylint: disable=g-import-not-at-top
  try:
    cfg = llama.get_config(row["model"])
  except (KeyError, ValueError):
    return None
  t, d, v = row["tokens"], cfg.d_model, cfg.vocab_size
  logits = 4 if row.get("logits_dtype") == "float32" else 2
  return t * d * 2 + d * v * 2 + 2 * t * v * logits


def classify(row: dict) -> str:
  """'step', 'init' or 'outside' (see the module's docstring)."""
  args, temp = row["argument_size_in_bytes"], row["temp_size_in_bytes"]
  over = row["peak_bytes"] - args
  if over <= temp + MiB:
    return "step"
  init = row.get("init_peak_bytes")
  if init is not None and init - args >= over - MiB:
    return "init"
  return "outside"


def summarize(rows: list[dict]) -> list[dict]:
  """One dict per (model, tokens, family): counts per class and, for the
  'outside' rows, ``floors``: {peak - args in bytes: (count, min temp,
  max temp)}, values within 2 MiB of the next smaller one counted with it
  under the smallest, and ``head_bytes``."""
  groups = collections.defaultdict(list)
  for r in rows:
    family = "optax" if r["optimizer"] == "optax" else "forge"
    groups[(r["model"], r["tokens"], family)].append(r)
  out = []
  for (model, tokens, family), rs in sorted(groups.items()):
    kinds = collections.Counter(classify(r) for r in rs)
    outside = sorted((r for r in rs if classify(r) == "outside"),
                     key=lambda r: r["peak_bytes"] - r["argument_size_in_bytes"])
    floors = {}  # values within 2 MiB of the previous one counted together
    key = None
    for r in outside:
      over, t = r["peak_bytes"] - r["argument_size_in_bytes"], r["temp_size_in_bytes"]
      if key is None or over - last > 2 * MiB:
        key = over  # the cluster's smallest value, in bytes
      last = over
      n, lo, hi = floors.get(key, (0, float("inf"), 0))
      floors[key] = (n + 1, min(lo, t), max(hi, t))
    out.append(dict(model=model, tokens=tokens, family=family,
                    counts=dict(kinds), floors=floors,
                    head_bytes=head_matmul_bytes(outside[0]) if outside else None))
  return out


def print_summary(summary: list[dict]) -> None:
  print("| model | T | optimizer | rows: step's peak / init's / outside the step | "
        "peak - args outside the step, GiB (rows; their temp GiB) | "
        "head matmul's x, kernel and 2 outputs, GiB | floor - those, MiB |")
  print("|---|---|---|---|---|---|---|")
  for s in summary:
    c = s["counts"]
    floors = "; ".join(
        f"{k / GiB:.3f} ({n}; {lo / GiB:.2f}-{hi / GiB:.2f})"
        for k, (n, lo, hi) in sorted(s["floors"].items(),
                                     key=lambda kv: -kv[1][0]))
    head = s["head_bytes"]
    main = max(s["floors"].items(), key=lambda kv: kv[1][0])[0] if s["floors"] else None
    print(f"| {s['model']} | {s['tokens']} | {s['family']} | "
          f"{c.get('step', 0)} / {c.get('init', 0)} / {c.get('outside', 0)} | "
          f"{floors or '-'} | {'-' if head is None else f'{head / GiB:.3f}'} | "
          f"{'-' if head is None or main is None else f'{(main - head) / MiB:.1f}'} |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("paths", nargs="+", help="memory_llama JSON files or folders")
  p.add_argument("--model", help="only this preset's rows")
  a = p.parse_args(argv)
  rows = read_rows(a.paths)
  if a.model:
    rows = [r for r in rows if r["model"] == a.model]
  if not rows:
    raise SystemExit(f"no single-device rows with a live peak in {a.paths}")
  summary = summarize(rows)
  print_summary(summary)
  return summary


if __name__ == "__main__":
  main()
