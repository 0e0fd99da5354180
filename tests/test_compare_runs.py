"""compare_runs: per-step loss differences against the baseline run."""

import json

import numpy as np
import pytest

from experiments import compare_runs


def _run(tmp_path, name, losses, val=None, optimizer="fold-adam", **config):
  d = tmp_path / name
  d.mkdir()
  records = [{"step": i + 1, "loss": float(l)} for i, l in enumerate(losses)]
  for step, v in (val or {}).items():
    records[step - 1]["val_loss"] = v
  summary = dict(median_step_s=0.01, median_tokens_per_s=1000.0, peak_bytes=None,
                 final_loss=float(losses[-1]), final_val_loss=float("nan"))
  (d / "metrics.json").write_text(json.dumps(dict(
      config={"optimizer": optimizer, **config}, records=records, summary=summary,
      num_params=1000, device="cpu", jax="x")))
  return str(d)


def test_differences_and_windows(tmp_path, capsys):
  rng = np.random.default_rng(0)
  base = rng.random(60) + 4
  other = base + rng.normal(0, 1e-3, 60)
  rows = compare_runs.main([_run(tmp_path, "a", other, {50: 4.2}),
                            _run(tmp_path, "b", base, {50: 4.0})])
  diff = np.abs(other - base)
  assert rows[0]["steps"] == 60
  assert rows[0]["mean_abs_dloss"] == pytest.approx(diff.mean())
  assert rows[0]["mean_abs_dloss_first"][10] == pytest.approx(diff[:10].mean())
  assert rows[0]["max_abs_dloss"] == pytest.approx(diff.max())
  assert rows[0]["mean_abs_dval_loss"] == pytest.approx(0.2)
  assert rows[1]["mean_abs_dloss"] == 0.0  # the baseline against itself
  assert "mean abs dloss 1-50 |" in capsys.readouterr().out


def test_a_window_longer_than_the_runs_says_what_it_covers(tmp_path, capsys):
  base = np.linspace(5, 4, 5)
  compare_runs.main([_run(tmp_path, "a", base + 0.01), _run(tmp_path, "b", base)])
  out = capsys.readouterr().out
  assert "mean abs dloss 1-5 (of window 50) |" in out
  assert "mean abs dloss 1-10 " not in out and "1-5 (of window 10)" in out


def test_a_run_stopped_before_its_first_evaluation_and_other_data(tmp_path, capsys):
  """No val loss yet (None in its summary) prints "-"; a run on another
  seed is named as not comparable step by step; bad --windows is refused."""
  base = np.linspace(5, 4, 6)
  stopped = _run(tmp_path, "a", base[:3] + 0.01, seed=1)
  summary = json.loads((tmp_path / "a" / "metrics.json").read_text())
  summary["summary"].update(final_val_loss=None, median_step_s=None,
                            median_tokens_per_s=None)
  (tmp_path / "a" / "metrics.json").write_text(json.dumps(summary))
  rows = compare_runs.main([stopped, _run(tmp_path, "b", base, seed=0)])
  out = capsys.readouterr().out
  assert rows[0]["steps"] == 3
  assert "note: " + stopped + " differs from the baseline in seed=1 (baseline 0)" in out
  line = [l for l in out.splitlines() if l.startswith("| " + stopped)][0]
  assert line.endswith("| - | - | nan | 4.6100 | - |")
  for bad in ("a", "0"):
    with pytest.raises(SystemExit):
      compare_runs.main([stopped, "--windows", bad])
