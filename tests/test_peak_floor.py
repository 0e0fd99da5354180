"""experiments.peak_floor sorts memory_llama rows by what set their peak."""

import json

import pytest

from experiments import peak_floor

GiB, MiB = 2**30, 2**20
ARGS = 30 * GiB


def row(optimizer, temp, peak_over_args, init_over_args=0, tokens=2048,
        tp=1, **kw):
  return dict(model="llama3.1-8b", tokens=tokens, optimizer=optimizer, tp=tp,
              argument_size_in_bytes=ARGS, temp_size_in_bytes=temp,
              peak_bytes=ARGS + peak_over_args,
              init_peak_bytes=ARGS + init_over_args, **kw)


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
  read, unreadable = peak_floor.read_rows([str(tmp_path)])
  assert len(read) == 6 and unreadable == [str(tmp_path / "memory_cut.json")]
  assert [peak_floor.classify(r) for r in rows[:6]] == [
      "step", "step", "outside", "outside", "outside", "init"]
  summary = peak_floor.main([str(tmp_path)])
  printed = capsys.readouterr()
  assert "skipped 1 file(s)" in printed.err
  by_family = {s["family"]: s for s in summary}
  assert by_family["optax"]["counts"] == {"step": 1}
  assert by_family["optax"]["floors"] == []
  forge = by_family["forge"]
  assert forge["counts"] == {"step": 1, "outside": 3, "init": 1}
  assert [(f["low"], f["high"], f["rows"], f["temp_low"], f["temp_high"],
           dict(f["kinds"])) for f in forge["floors"]] == [
               (floor, floor + MiB, 2, GiB, GiB + 512 * MiB, {"outside": 2}),
               (floor + 700 * MiB, floor + 700 * MiB, 1, GiB, GiB,
                {"outside": 1}),
               (4 * GiB, 4 * GiB, 1, GiB, GiB, {"init": 1})]
  # Llama-3.1-8B's head at T=2048 in bf16, fused step: its largest XLA
  # matmul is the forward (x, the 4096 x 128256 kernel, two 2048 x 128256
  # outputs).
  assert forge["floors"][0]["head_bytes"] == (
      2048 * 4096 + 4096 * 128256 + 2 * 2048 * 128256) * 2
  assert ("| llama3.1-8b | 2048 | forge | not recorded | after the init | "
          "1 / 1 / 0 / 3 |" in printed.out)
  with pytest.raises(SystemExit) as e:
    peak_floor.main([str(tmp_path), "--model", "qwen3-32b"])
  assert e.value.code == 2 and "--model qwen3-32b" in capsys.readouterr().err
  # A group's second cluster does not repeat the group's counts.
  lines = [l for l in printed.out.splitlines() if "| forge |" in l]
  assert len(lines) == 3 and lines[1].count("| (counts above) |") == 1
  with pytest.raises(SystemExit) as e:
    peak_floor.main([str(tmp_path / "missing")])
  assert e.value.code == 2 and "no such file" in capsys.readouterr().err


def test_floors_chain_in_steps_of_two_mib_and_keep_their_range():
  rows = [row("forge-bf16", GiB, 2 * GiB + i * 3 * MiB // 2) for i in range(4)]
  (floor,) = peak_floor.summarize(rows)[0]["floors"]
  assert (floor["low"], floor["high"], floor["rows"]) == (
      2 * GiB, 2 * GiB + 9 * MiB // 2, 4)


def test_what_set_the_peak_follows_the_compile_order():
  # Compiled after the init (the default): the init's peak comes first.
  by_compile = row("forge-bf16", GiB, 2 * GiB, compile_peak_bytes=ARGS + 2 * GiB)
  assert peak_floor.classify(by_compile) == "compile"
  no_init = dict(by_compile)
  del no_init["init_peak_bytes"]  # rows before stop 18
  assert peak_floor.classify(no_init) == "compile"
  del no_init["compile_peak_bytes"]
  assert peak_floor.classify(no_init) == "outside"
  # Compiled first, the init's peak includes the compile's: the compile is
  # named when its own peak is as high.
  first = row("forge-bf16", GiB, 2 * GiB, init_over_args=2 * GiB,
              compile_peak_bytes=ARGS + 2 * GiB, compile_first=True)
  assert peak_floor.classify(first) == "compile"
  assert peak_floor.classify(dict(first, compile_peak_bytes=GiB)) == "init"
  # A single row in a file of its own, not a list.
  assert peak_floor.summarize([first])[0]["compile_first"]


def test_head_bytes_follow_the_optimizer_not_the_logits_dtype():
  t, d, v = 2048, 4096, 128256
  fused = row("forge-bf16", GiB, 2 * GiB)
  assert peak_floor.head_matmul_bytes(fused) == (t * d + d * v + 2 * t * v) * 2
  # optax's step runs the head's dW in XLA too: x, dy and two D x V outputs.
  assert peak_floor.head_matmul_bytes(dict(fused, optimizer="optax")) == (
      t * d + t * v + 2 * d * v) * 2
  # fp32 logits are a cast after the bf16 matmul: the same matmul bytes.
  assert peak_floor.head_matmul_bytes(dict(fused, logits_dtype="float32")) == (
      peak_floor.head_matmul_bytes(fused))
  assert peak_floor.head_matmul_bytes(dict(fused, model="no-such-model")) is None


def test_rows_of_different_logits_dtypes_are_not_counted_together():
  rows = [row("forge-bf16", GiB, 2 * GiB, logits_dtype="bfloat16"),
          row("forge-bf16", GiB, 2 * GiB, logits_dtype="float32"),
          row("forge-bf16", GiB, 2 * GiB)]
  summary = peak_floor.summarize(rows)
  assert [s["logits"] for s in summary] == [
      "bfloat16", "float32", "not recorded"]
  assert [len(s["floors"]) for s in summary] == [1, 1, 1]
