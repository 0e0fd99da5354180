"""experiments.peak_floor sorts memory_llama rows by what set their peak."""

import json

import pytest

from experiments import peak_floor

GiB, MiB = 2**30, 2**20


def row(optimizer, temp, peak_over_args, init_over_args=0, tokens=2048,
        tp=1, **kw):
  args = 30 * GiB
  return dict(model="llama3.1-8b", tokens=tokens, optimizer=optimizer, tp=tp,
              argument_size_in_bytes=args, temp_size_in_bytes=temp,
              peak_bytes=args + peak_over_args,
              init_peak_bytes=args + init_over_args, **kw)


def test_rows_are_split_by_what_set_their_peak(tmp_path, capsys):
  floor = 2 * GiB + 5 * MiB
  rows = [
      row("optax", 9 * GiB, 9 * GiB),  # the step's own peak
      row("forge-int8", 3 * GiB, 3 * GiB),  # the step's: temp above the floor
      row("forge-int8", GiB, floor),  # a floor the step did not set...
      row("forge-bf16", GiB + 512 * MiB, floor + MiB),  # ...the same, within 2 MiB
      row("forge-bf16", GiB, floor + 700 * MiB),  # another floor
      row("forge-bf16", GiB, 4 * GiB, init_over_args=4 * GiB),  # the init's
      row("forge-bf16", GiB, 9 * GiB, tp=2),  # several devices: not read
      dict(row("optax", GiB, GiB), peak_bytes=None),  # no GPU: not read
  ]
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "memory_a.json").write_text(json.dumps(rows[:4]))
  (tmp_path / "memory_b.json").write_text(json.dumps(rows[4:]))
  (tmp_path / "memory_cut.json").write_text('[{"model"')  # cut by a time limit
  read = peak_floor.read_rows([str(tmp_path)])
  assert len(read) == 6
  assert [peak_floor.classify(r) for r in rows[:6]] == [
      "step", "step", "outside", "outside", "outside", "init"]
  summary = peak_floor.main([str(tmp_path)])
  by_family = {s["family"]: s for s in summary}
  assert by_family["optax"]["counts"] == {"step": 1}
  forge = by_family["forge"]
  assert forge["counts"] == {"step": 1, "outside": 3, "init": 1}
  assert forge["floors"] == {floor: (2, GiB, GiB + 512 * MiB),
                             floor + 700 * MiB: (1, GiB, GiB)}
  # Llama-3.1-8B's head at T=2048 in bf16: x, the 4096 x 128256 kernel and
  # two 2048 x 128256 outputs.
  assert forge["head_bytes"] == (2048 * 4096 + 4096 * 128256
                                 + 2 * 2048 * 128256) * 2
  assert "| llama3.1-8b | 2048 | forge | 1 / 1 / 3 |" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    peak_floor.main([str(tmp_path), "--model", "qwen3-32b"])
