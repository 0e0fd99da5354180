"""What set a ``memory_llama`` row's live peak: the step, or something else.

A row's ``peak_bytes`` is the process's ``peak_bytes_in_use`` high-water
mark after its steps. If the step set it, the peak is the step's arguments
plus at most its temp (``memory_analysis()``). This reads rows (their JSON
files, or folders searched for ``memory_*.json``) and, per model, T,
optimizer family ('optax' or 'forge'), logits dtype and compile order,
sorts each row by what set its peak (1 MiB of slack throughout):

- 'step': peak <= arguments + temp;
- 'init': above that, and the peak after initialization
  (``init_peak_bytes``) as high (stop 25's unrolled init, since fixed);
- 'compile': above that, and the peak right after the compile
  (``compile_peak_bytes``, rows since stop 44) as high;
- 'outside': above that, and neither recorded as high.

For the rows not set by the step it prints the values of peak − arguments,
those within 2 MiB of each other counted together (their range, how many,
the temps under them), and beside them the bytes of the head's largest
matmul that XLA runs in that step, which an autotuner timing it would hold:
operands and two outputs (one to check the others against). The fused step
runs the head's forward (x T × D, kernel D × V, out T × V) and its dx
(dy T × V, kernel, out T × D) in XLA; optax's step its dW too (x, dy, out
D × V). All in bf16, whatever the logits dtype: the model's head is a
bf16 matmul whose output is cast to the logits dtype after it (so it was
in rows that do not record one, from before the option: llama.py before
commit cedc42b). Were XLA to fold a cast into a matmul, fp32 logits would
make that matmul's logits and dy twice as large; this is not counted. A
value the same whatever the temp is a floor the step did not set; this
matches sizes, it does not observe the autotuner.

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
import sys

GiB = 2**30
MiB = 2**20
SLACK = MiB


def read_rows(paths) -> tuple[list[dict], list[str]]:
  """``(rows, unreadable)``: the single-device rows with a live peak in the
  JSON files ``paths`` (folders are searched for ``memory_*.json``), and the
  files that are not JSON (e.g. cut by a time limit).

  Raises:
    FileNotFoundError: for a path that does not exist.
  """
  files = []
  for p in paths:
    if not os.path.exists(p):
      raise FileNotFoundError(f"no such file or folder: {p}")
    files += (sorted(glob.glob(os.path.join(p, "**", "memory_*.json"),
                               recursive=True)) if os.path.isdir(p) else [p])
  rows, unreadable = [], []
  for f in files:
    with open(f) as fh:
      try:
        data = json.load(fh)
      except json.JSONDecodeError:
        unreadable.append(f)
        continue
    for r in data if isinstance(data, list) else [data]:
      if (isinstance(r, dict) and r.get("peak_bytes") is not None
          and "temp_size_in_bytes" in r and r.get("tp", 1) == 1):
        rows.append(r)
  return rows, unreadable


def head_matmul_bytes(row: dict) -> int | None:
  """Bytes of the largest of the head's XLA matmuls in ``row``'s step (see
  the module's docstring), or None for a preset this does not know."""
  from forge_jax.models import llama  # pylint: disable=g-import-not-at-top
  try:
    cfg = llama.get_config(row["model"])
  except (KeyError, ValueError):
    return None
  t, d, v = row["tokens"], cfg.d_model, cfg.vocab_size
  forward = (t * d + d * v + 2 * t * v) * 2
  dx = (t * v + d * v + 2 * t * d) * 2
  dw = (t * d + t * v + 2 * d * v) * 2
  return max(forward, dx, *([dw] if row["optimizer"] == "optax" else []))


def classify(row: dict) -> str:
  """'step', 'init', 'compile' or 'outside' (see the module's docstring)."""
  over = row["peak_bytes"] - row["argument_size_in_bytes"]
  if over <= row["temp_size_in_bytes"] + SLACK:
    return "step"
  peak = row["peak_bytes"]
  init, comp = row.get("init_peak_bytes"), row.get("compile_peak_bytes")
  # In the default order the init comes first; compiled first, the init's
  # peak includes the compile's.
  order = ([("compile", comp), ("init", init)] if row.get("compile_first")
           else [("init", init), ("compile", comp)])
  for kind, value in order:
    if value is not None and value >= peak - SLACK:
      return kind
  return "outside"


def summarize(rows: list[dict]) -> list[dict]:
  """One dict per (model, tokens, family, logits, compile_first), where
  ``logits`` is the row's recorded logits dtype or 'not recorded' (rows
  from 2026-11-30, before the option; they ran other code, and steps with
  different logits dtypes hold different activations): ``counts`` per
  class, and ``floors``, one per cluster of the rows not set by the step
  (their peak − arguments within 2 MiB of the next smaller one): dicts of
  ``low``, ``high`` (bytes), ``rows``, ``temp_low``, ``temp_high``,
  ``kinds`` (class counts) and ``head_bytes`` (of the cluster's first
  row)."""
  groups = collections.defaultdict(list)
  for r in rows:
    family = "optax" if r["optimizer"] == "optax" else "forge"
    logits = r.get("logits_dtype") or "not recorded"
    groups[(r["model"], r["tokens"], family, logits,
            bool(r.get("compile_first")))].append(r)
  out = []
  for (model, tokens, family, logits, first), rs in sorted(groups.items()):
    kinds = [(classify(r), r) for r in rs]
    above = sorted(((k, r) for k, r in kinds if k != "step"),
                   key=lambda kr: kr[1]["peak_bytes"] - kr[1]["argument_size_in_bytes"])
    floors = []
    for kind, r in above:
      over = r["peak_bytes"] - r["argument_size_in_bytes"]
      temp = r["temp_size_in_bytes"]
      if not floors or over - floors[-1]["high"] > 2 * MiB:
        floors.append(dict(low=over, high=over, rows=0, temp_low=temp,
                           temp_high=temp, kinds=collections.Counter(),
                           head_bytes=head_matmul_bytes(r)))
      f = floors[-1]
      f.update(high=over, rows=f["rows"] + 1, temp_low=min(f["temp_low"], temp),
               temp_high=max(f["temp_high"], temp))
      f["kinds"][kind] += 1
    out.append(dict(model=model, tokens=tokens, family=family,
                    logits=logits, compile_first=first,
                    counts=dict(collections.Counter(k for k, _ in kinds)),
                    floors=floors))
  return out


def print_summary(summary: list[dict]) -> None:
  print("| model | T | optimizer | logits | compiled | rows: step / init / "
        "compile / outside | peak − args not set by the step, GiB | rows (what set "
        "them) | their temp, GiB | largest head matmul's bytes, GiB | "
        "peak − args − those, MiB |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for s in summary:
    c = s["counts"]
    group = (f"| {s['model']} | {s['tokens']} | {s['family']} | "
             f"{s['logits']} | "
             f"{'first' if s['compile_first'] else 'after the init'} |")
    counts = (f" {c.get('step', 0)} / {c.get('init', 0)} / "
              f"{c.get('compile', 0)} / {c.get('outside', 0)} |")
    if not s["floors"]:
      print(group + counts + " - | - | - | - | - |")
    for n, f in enumerate(s["floors"]):
      # A group's further clusters: its counts are on its first line.
      head = group + (counts if n == 0 else " (counts above) |")
      h = f["head_bytes"]
      kinds = ", ".join(f"{n} {k}" for k, n in sorted(f["kinds"].items()))
      rest = ("-" if h is None else
              f"{(f['low'] - h) / MiB:.2f}–{(f['high'] - h) / MiB:.2f}")
      print(f"{head} {f['low'] / GiB:.3f}–{f['high'] / GiB:.3f} | "
            f"{f['rows']} ({kinds}) | {f['temp_low'] / GiB:.2f}–"
            f"{f['temp_high'] / GiB:.2f} | "
            f"{'-' if h is None else f'{h / GiB:.3f}'} | {rest} |")


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("paths", nargs="+", help="memory_llama JSON files or folders")
  p.add_argument("--model", help="only this preset's rows")
  a = p.parse_args(argv)
  try:
    rows, unreadable = read_rows(a.paths)
  except FileNotFoundError as e:
    p.error(str(e))
  if unreadable:
    print(f"skipped {len(unreadable)} file(s) that are not JSON: "
          + ", ".join(unreadable), file=sys.stderr)
  if a.model:
    rows = [r for r in rows if r["model"] == a.model]
  if not rows:
    p.error(f"no single-device rows with a live peak in {a.paths}"
            + (f" for --model {a.model}" if a.model else ""))
  summary = summarize(rows)
  print_summary(summary)
  return summary


if __name__ == "__main__":
  main()
