"""Runs ``experiments.train_lm`` once per variant, each in its own process.

One process per run keeps each run's ``peak_bytes_in_use`` its own and lets a
crashed variant fail loudly without taking the others' numbers with it.
Also reads back what the benchmark scripts print (``read_json_or_log``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def read_json_or_log(path: str, marker: str):
  """The JSON a script wrote to ``path``, or, if ``path`` is its log, the list
  of JSON rows printed on the lines that start with ``marker`` (``{"shape"``)."""
  with open(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError:
    return [json.loads(x) for x in text.splitlines() if x.startswith(marker)]


def slug(name: str) -> str:
  """A directory name for a variant."""
  return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def run_variants(variants: dict[str, list[str]], *, out: str, common: list[str],
                 table_only: bool = False) -> dict[str, dict]:
  """Trains every variant (``train_lm`` flags) and returns its metrics.json.

  Args:
    variants: name -> train_lm flags of that variant.
    out: root directory; each variant writes to ``out/<slug(name)>``.
    common: train_lm flags for every variant (preset, steps, corpus...).
    table_only: do not train; read the metrics of earlier runs.

  Raises:
    subprocess.CalledProcessError: if a run fails.
  """
  results = {}
  for name, flags in variants.items():
    run_dir = os.path.join(out, slug(name))
    if not table_only:
      # common last: flags given after `--` override a variant's own.
      cmd = [sys.executable, "-m", "experiments.train_lm", "--out", run_dir,
             *flags, *common]
      print("$", " ".join(cmd), file=sys.stderr, flush=True)
      # The run's summary line goes where its progress goes (file
      # descriptor 2): this script's stdout is its table.
      subprocess.run(cmd, check=True, stdout=2)
    with open(os.path.join(run_dir, "metrics.json")) as f:
      results[name] = json.load(f)
  return results


def describe(metrics: dict) -> str:
  c = metrics["config"]
  return (f"{c['preset']}: {metrics['num_params'] / 1e6:.1f}M params, {c['corpus']} "
          f"({metrics['train_tokens']:,} train / {metrics['val_tokens']:,} val tokens), "
          f"{c['steps']} steps of {c['batch_size']}x{c['seq_len']} tokens, "
          f"{metrics['device']}, jax {metrics['jax']}")


def add_arguments(p: argparse.ArgumentParser, *, name: str, variants: dict,
                  sep: str, default_out: str) -> None:
  """The flags every train_lm-comparison script shares."""
  p.add_argument("--preset", default="cpu-tiny")
  p.add_argument("--steps", type=int, default=None)
  p.add_argument(f"--{name}", default=sep.join(variants),
                 help=f"{sep!r}-separated, from {list(variants)}")
  p.add_argument("--out", default=default_out)
  p.add_argument("--table-only", action="store_true",
                 help="print the table from existing runs under --out")
  p.add_argument("extra", nargs=argparse.REMAINDER,
                 help="after --, more train_lm flags for every run (e.g. --corpus)")


def run_selected(a: argparse.Namespace, *, name: str, variants: dict,
                 sep: str) -> dict[str, dict]:
  """Runs the variants chosen by ``--<name>`` with the shared flags."""
  chosen = getattr(a, name).split(sep)
  for v in chosen:
    if v not in variants:
      raise SystemExit(f"--{name}: {v!r} is not one of {list(variants)}")
  common = ["--preset", a.preset, *[x for x in a.extra if x != "--"]]
  if a.steps is not None:
    common += ["--steps", str(a.steps)]
  return run_variants({v: variants[v] for v in chosen}, out=a.out,
                      common=common, table_only=a.table_only)
