"""The kernel benchmark checks every timed case and computes its floor (CPU smoke)."""

import glob
import json

import jax
from jax.experimental import io_callback
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import bench_fused_dw


def test_bench_checks_cases_and_floors_from_nominal_peaks(tmp_path, capsys):
  rows = bench_fused_dw.main([
      "--shapes", "40:48x80", "--rules", "adamw,fold_adam_l3", "--modes",
      "fp32,int8", "--reps", "1", "--peak-size", "128", "--interpret",
      "--out", str(tmp_path)])
  assert len(rows) == 4
  for r in rows:
    assert "error" not in r, r
    assert r["rel_err"] < 1e-4  # checked against the reference in the run
    t, d_in, d_out = r["shape"]
    # Floor from the H200's nominal peaks, not from the CPU's measured ones.
    assert r["floor_s"] == pytest.approx(
        max(2 * t * d_in * d_out / 790e12, r["bytes"] / 4.3e12))
    assert r["fused_s"] > 0 and r["unfused_s"] > 0
  # The folded rule moves fewer state bytes than AdamW in the same mode.
  by = {(r["rule"], r["mode"]): r["bytes"] for r in rows}
  assert by["fold_adam_l3", "fp32"] < by["adamw", "fp32"]
  saved = json.load(open(glob.glob(str(tmp_path / "bench_fused_dw_*.json"))[0]))
  assert saved["floor_peaks"] == [790e12, 4.3e12] and saved["peak_flops"] > 0
  # An interpret-mode run says its times do not describe a GPU.
  assert "times, % of floor and speed-ups do not" in capsys.readouterr().out
  # Reprinting with another floor: the percentage of floor changes with it.
  bench_fused_dw.main(["--table-from", glob.glob(str(tmp_path / "*.json"))[0],
                       "--peaks", "1e9,1e9"])
  table = capsys.readouterr().out
  assert "floor peaks (given): 0 TFLOP/s" in table and "| 40 | 48→80 |" in table
  # A log (one JSON row per line) keeps its measured peaks.
  log = tmp_path / "bench.log"
  log.write_text("measured peaks: 791 TFLOP/s (bf16 8192³ matmul), 4.16 TB/s "
                 "(fp32 pass)\n" + "".join(json.dumps(r) + "\n" for r in rows))
  bench_fused_dw.main(["--table-from", str(log), "--peaks", "measured"])
  assert "floor peaks (measured in that run): 791 TFLOP/s" in capsys.readouterr().out


def test_bench_times_a_bf16_gradient_baseline_and_still_checks_fp32(
    tmp_path, capsys, monkeypatch):
  # --unfused-grad-dtype bfloat16 times the unfused step with dW rounded to
  # bf16; the kernel is still checked against the fp32 reference.
  from pallas_kernels.fused_dw import reference  # pylint: disable=g-import-not-at-top
  seen = []
  real = reference.fused_dw_update_reference

  def spy(*args, grad_dtype=jnp.float32, **kw):
    seen.append(jnp.dtype(grad_dtype).name)
    return real(*args, grad_dtype=grad_dtype, **kw)
  monkeypatch.setattr(bench_fused_dw, "fused_dw_update_reference", spy)
  rows = bench_fused_dw.main([
      "--shapes", "40:48x80", "--rules", "adamw", "--modes", "bf16-sr-bf16", "--reps",
      "1", "--peak-size", "128", "--interpret", "--unfused-grad-dtype",
      "bfloat16", "--out", str(tmp_path)])
  (r,) = rows
  assert "error" not in r and r["rel_err"] < 1e-2
  assert r["unfused_grad_dtype"] == "bfloat16" and r["unfused_s"] > 0
  assert {"float32", "bfloat16"} <= set(seen)  # checked in fp32, timed in bf16
  assert "unfused dW: bfloat16" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    bench_fused_dw.main(["--unfused-grad-dtype", "float16", "--interpret"])
  with pytest.raises(ValueError, match="unfused_grad_dtype='float16' must be"):
    bench_fused_dw.bench_case(bench_fused_dw.RULES["adamw"], "fp32", 8, 8, 8,
                              [], 1, np.random.default_rng(0),
                              unfused_grad_dtype="float16")


@pytest.mark.parametrize("peaks", ["1e12", "0,4.3e12", "nan,nan", "790e12,-1"])
def test_bad_peaks_is_refused_before_measuring(peaks):
  with pytest.raises(SystemExit, match="--peaks: expected FLOPS,BYTES_PER_S"):
    bench_fused_dw.main(["--peaks", peaks, "--shapes", "40:48x80",
                         "--interpret"])


def test_bench_times_the_mosaic_kernel_where_in_scope(tmp_path, capsys):
  rows = bench_fused_dw.main([
      "--shapes", "64:64x128", "--rules", "adamw", "--modes", "fp32,bf16-sr,int8",
      "--reps", "1", "--peak-size", "128", "--interpret", "--mosaic",
      "--out", str(tmp_path)])
  by_mode = {r["mode"]: r for r in rows}
  for mode in ("fp32", "bf16-sr", "int8"):  # stochastic rounding, int8 states
    # Checked in the run. int8 states: one code may land one step away where
    # the kernel and the reference round a value at a code boundary
    # differently (XLA's CPU code at -O0, tests/conftest.py, contracts fewer
    # multiply-adds: one nu code of 8,192 differs there, relative error
    # 2.1e-4 in the chain of 3). 5e-4 passes that one code and fails 8 or
    # more flipped codes (5.9e-4), a wrong scale or a wrong rounding.
    bound = 5e-4 if mode == "int8" else 1e-5
    assert by_mode[mode]["mosaic_rel_err"] < bound
    assert by_mode[mode]["mosaic_s"] > 0
  table = capsys.readouterr().out
  assert "| Mosaic ms | kernel |" in table and "| mosaic |" in table
  # Folded moments: l = 3 in scope (checked, timed); l = 2 out of scope:
  # said why, not timed.
  rows = bench_fused_dw.main([
      "--shapes", "64:64x128", "--rules", "fold_adam_l3,fold_adam_l2", "--modes",
      "fp32", "--reps", "1", "--peak-size", "128", "--interpret", "--mosaic",
      "--out", str(tmp_path)])
  by_rule = {r["rule"]: r for r in rows}
  assert by_rule["fold_adam_l3"]["mosaic_rel_err"] < 1e-5
  assert by_rule["fold_adam_l3"]["mosaic_s"] > 0
  l2 = by_rule["fold_adam_l2"]
  assert "fold block 4 must be at least 8" in l2["mosaic_error"] and "mosaic_s" not in l2
  assert "(rule 'fold_adam_l2': the fold block 4" in capsys.readouterr().out


def test_bench_reports_a_mosaic_failure_and_keeps_the_row(tmp_path, capsys,
                                                          monkeypatch):
  # A kernel that fails to build (here: raises) is a result of the run: its
  # row keeps the other variants' columns, labelled apart from a refusal.
  from pallas_kernels.fused_dw import kernel_mosaic  # pylint: disable=g-import-not-at-top

  def broken(*args, **kwargs):
    raise ValueError("Mosaic GPU kernel exceeds available shared memory")

  monkeypatch.setattr(kernel_mosaic, "fused_dw_update_mosaic", broken)
  rows = bench_fused_dw.main([
      "--shapes", "64:64x128", "--rules", "adamw", "--modes", "fp32",
      "--reps", "1", "--peak-size", "128", "--interpret", "--mosaic",
      "--out", str(tmp_path)])
  (row,) = rows
  assert row["mosaic_error"] == ("failed: ValueError: Mosaic GPU kernel "
                                 "exceeds available shared memory")
  assert row["fused_s"] > 0 and row["unfused_s"] > 0 and "mosaic_s" not in row
  captured = capsys.readouterr()
  assert "(failed: ValueError" in captured.out
  assert "Traceback" in captured.err


def test_dispatch_probe_checks_chained_ops_and_times_both_ways(capsys):
  from experiments import probe_dispatch  # pylint: disable=g-import-not-at-top
  rows = probe_dispatch.main(["--shapes", "64:64x128", "--chain", "2",
                              "--reps", "1", "--interpret"])
  by = {r["implementation"]: r for r in rows}
  for impl in ("triton", "mosaic"):  # checked against 2 reference updates
    assert "error" not in by[impl], by[impl]
    assert by[impl]["rel_err"] < 1e-5
    assert by[impl]["single_ms"] > 0 and by[impl]["chained_ms"] > 0
  assert "chained_ms" not in by["xla"]  # XLA merges chained updates
  assert "(not comparable)" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="--shapes"):
    probe_dispatch.main(["--shapes", "64x128"])


def test_mosaic_tile_probe_checks_int8_states_before_timing(capsys):
  from experiments import probe_mosaic  # pylint: disable=g-import-not-at-top
  lines = probe_mosaic.main(["--shapes", "64:128x128", "--modes", "int8",
                             "--configs", "m64n128t64s4", "--reps", "1",
                             "--interpret"])
  out = capsys.readouterr().out
  # Each kernel is checked against the unfused step first, then timed.
  assert "int8 triton:" in out and "int8 m64n128t64s4:" in out
  assert "WRONG" not in out and "ERROR" not in out
  assert len(lines) == 1 and "m64n128t64s4" in lines[0]
  # The bf16-gradient unfused baseline is timed beside the fp32 one.
  assert "int8 xla-bf16dW:" in out and "| xla-bf16dW " in lines[0]
  with pytest.raises(SystemExit, match="--modes"):
    probe_mosaic.main(["--shapes", "64:128x128", "--modes", "fp8",
                       "--configs", "m64n128t64s4", "--interpret"])
  with pytest.raises(SystemExit, match="--configs"):
    probe_mosaic.main(["--configs", "nope", "--interpret"])


def test_mosaic_tile_probe_runs_sgd_without_states(capsys):
  # --rule sgd: no optimizer state; the kernel is checked, then timed.
  from experiments import probe_mosaic  # pylint: disable=g-import-not-at-top
  lines = probe_mosaic.main(["--shapes", "64:128x128", "--modes", "bf16-sr",
                             "--configs", "m128n128t64s3x3", "--reps", "1",
                             "--rule", "sgd", "--interpret"])
  out = capsys.readouterr().out
  assert "bf16-sr m128n128t64s3x3:" in out
  assert "WRONG" not in out and "ERROR" not in out
  assert len(lines) == 1 and " sgd floor" in lines[0]
  with pytest.raises(SystemExit, match="--rule sgd has no state"):
    probe_mosaic.main(["--shapes", "64:128x128", "--modes", "int8", "--rule", "sgd",
                       "--configs", "m128n128t64s3x3", "--interpret"])


def test_chained_applies_each_op_in_turn_on_rotating_sets():
  # chained(step, k) is k applications of step, the i-th on sets[i % n].
  sets = [(jnp.full((2,), float(i + 1)), jnp.full((3,), 10.0 * (i + 1)))
          for i in range(3)]
  step = lambda x, dy, c, scale: (c * scale + x.sum() + dy.sum(),)  # noqa: E731
  got = bench_fused_dw.chained(step, 5)(sets, [jnp.float32(0.5)],
                                        [jnp.float32(2.0)])
  want = jnp.float32(0.5)
  for i in range(5):
    x, dy = sets[i % 3]
    want = want * 2.0 + x.sum() + dy.sum()
  assert float(got[0]) == float(want)


@pytest.mark.parametrize("fault", ["stale_w", "garbage"])
def test_bench_refuses_to_time_a_mosaic_chain_that_differs(tmp_path, capsys,
                                                           monkeypatch, fault):
  # A kernel right on its first op but wrong on the second, as one that
  # reads a buffer XLA reused would be: it returns its input W (a stale
  # read, or a dropped update: one update's worth, about 1% of W at the
  # check's learning rate) or W + 1. The chain's check catches both.
  from pallas_kernels.fused_dw import kernel_mosaic  # pylint: disable=g-import-not-at-top
  real = kernel_mosaic.fused_dw_update_mosaic
  runs = []

  def second_run():  # counts the op's executions (not its traces)
    runs.append(1)
    return np.bool_(len(runs) == 2)

  def wrong_when_chained(x, dy, w, *args, **kwargs):
    new_w, new_state = real(x, dy, w, *args, **kwargs)
    wrong = io_callback(second_run, jax.ShapeDtypeStruct((), jnp.bool_),
                        ordered=True)
    bad = w.astype(new_w.dtype) if fault == "stale_w" else new_w + 1.0
    return jnp.where(wrong, bad, new_w), new_state

  monkeypatch.setattr(kernel_mosaic, "fused_dw_update_mosaic", wrong_when_chained)
  (row,) = bench_fused_dw.main([
      "--shapes", "64:64x128", "--rules", "adamw", "--modes", "fp32",
      "--reps", "1", "--peak-size", "128", "--interpret", "--mosaic",
      "--out", str(tmp_path)])
  assert row["mosaic_rel_err"] > bench_fused_dw.CHAIN_MAX_REL_ERR
  assert row["mosaic_error"].startswith("its chain of 3 differs from the unfused")
  assert "mosaic_s" not in row
  assert row["rel_err"] < 1e-5  # Triton's chain, checked the same way
  capsys.readouterr()


def test_chained_timing_compiles_once():
  # The warm-up call and the timed ones see the same argument structure.
  run = bench_fused_dw.chained(lambda x, dy, c, s: (c * s + x.sum(),), 3)
  sets = [(jnp.ones((2,)), jnp.ones((3,)))] * 3
  seconds = bench_fused_dw._time_chained(run, sets, [jnp.float32(1.0)],
                                         [jnp.float32(0.5)], reps=6, chain=3,
                                         rounds=2)
  assert seconds > 0 and run._cache_size() == 1


def test_chained_gives_each_op_its_own_rest():
  # per_op(rest, i): a chain gives op i, e.g., its own rounding seed.
  run = bench_fused_dw.chained(lambda x, dy, c, seed: (c * 10 + seed,), 3,
                               per_op=lambda rest, i: (rest[0] + i,))
  sets = [(jnp.ones((2,)), jnp.ones((3,)))]
  (got,) = run(sets, (jnp.int32(0),), (jnp.int32(1),))
  assert int(got) == 123


@pytest.mark.parametrize("flag", ["--reps", "--chain", "--rounds"])
def test_counts_below_one_are_refused_before_measuring(flag):
  with pytest.raises(SystemExit, match=f"{flag}: must be >= 1, got 0"):
    bench_fused_dw.main([flag, "0", "--interpret", "--shapes", "64:64x128"])


@pytest.mark.parametrize("barrier", bench_fused_dw.BARRIERS)
def test_chained_barrier_variants_apply_the_same_ops(barrier):
  # x and dY behind the barrier or not, the chain computes the same thing.
  sets = [(jnp.full((2,), float(i + 1)), jnp.full((3,), 10.0 * (i + 1)))
          for i in range(3)]
  step = lambda x, dy, c, scale: (c * scale + x.sum() + dy.sum(),)  # noqa: E731
  got = bench_fused_dw.chained(step, 3, barrier=barrier)(
      sets, [jnp.float32(0.5)], [jnp.float32(2.0)])
  want = jnp.float32(0.5)
  for x, dy in sets:
    want = want * 2.0 + x.sum() + dy.sum()
  assert float(got[0]) == float(want)
  (dw,) = bench_fused_dw._dw_chain(1, barrier)(
      [(jnp.ones((4, 2), jnp.bfloat16), jnp.ones((4, 3), jnp.bfloat16))], (), ())
  np.testing.assert_array_equal(np.asarray(dw), np.full((2, 3), 4.0))


def test_state_barrier_refuses_a_repeated_set():
  # Without x and dY behind the barrier, a set used twice in one chain could
  # have its dW computed once: refused, in the function and in the CLI.
  run = bench_fused_dw.chained(lambda x, dy, c: (c + x.sum(),), 4,
                               barrier="state")
  with pytest.raises(ValueError, match="chain=4 > 3 sets"):
    run([(jnp.ones((2,)), jnp.ones((3,)))] * 3, (jnp.float32(0),), ())
  with pytest.raises(ValueError, match="barrier='none'"):
    bench_fused_dw.chained(lambda x, dy, c: (c,), 2, barrier="none")
  with pytest.raises(ValueError, match="chain=4 > 3 sets"):
    bench_fused_dw._dw_chain(4, "state")([(jnp.ones((2, 2)), jnp.ones((2, 3)))] * 3,
                                         (), ())
  with pytest.raises(SystemExit, match="--chain must be <= 3"):
    bench_fused_dw.main(["--barrier", "state", "--chain", "4", "--interpret",
                         "--shapes", "64:64x128"])
  with pytest.raises(SystemExit, match="--barrier: only with --timing chain"):
    bench_fused_dw.main(["--barrier", "state", "--timing", "call",
                         "--interpret", "--shapes", "64:64x128"])
  with pytest.raises(SystemExit, match="--by-shape: only with --table-from"):
    bench_fused_dw.main(["--by-shape", "--interpret", "--shapes", "64:64x128"])


def test_table_by_shape_puts_the_modes_side_by_side(tmp_path, capsys):
  # Hand-made rows: one shape with fp32 and int8 (int8 without a kernel
  # time), another with fp32, a failed bf16 row and int8. Each cell lists
  # the header's modes in its order, "—" where a mode has no row, failed or
  # has no kernel time.
  base = dict(rule="adamw", xla_dw_s=1e-4, torch_adamw_s=8e-5,
              timing="chain", chain=3)
  # "shape" first: a log's rows are its lines that start with {"shape".
  a, b = dict(shape=[512, 4096, 1024], **base), dict(shape=[512, 4096, 4096], **base)
  rows = [dict(a, mode="fp32", unfused_s=5e-5, mosaic_s=4e-5, bytes=4.3e8,
               sm_clock_mhz=1980),
          dict(a, mode="int8", unfused_s=9e-5, bytes=4.3e7,
               mosaic_error="refused"),
          dict(b, mode="fp32", unfused_s=2e-4, mosaic_s=1e-4, bytes=4.3e8,
               sm_clock_mhz=1900),
          dict(b, mode="bf16-sr-bf16", error="ValueError: x", bytes=float("nan")),
          dict(b, mode="int8", unfused_s=3e-4, mosaic_s=2e-4, bytes=4.3e7,
               sm_clock_mhz=1800)]
  log = tmp_path / "bench.log"
  log.write_text("".join(json.dumps(r) + "\n" for r in rows))
  bench_fused_dw.main(["--table-from", str(log), "--peaks", "790e12,4.3e12",
                       "--by-shape"])
  out = capsys.readouterr().out
  assert "by shape (fp32 / int8 / bf16-sr-bf16)" in out
  assert "timing: 3 ops chained" in out
  ms = lambda v: f"{v * 1e3:.3f}"  # noqa: E731
  flop = lambda d_out: 2 * 512 * 4096 * d_out / 790e12  # noqa: E731
  fa32, fa8 = max(flop(1024), 4.3e8 / 4.3e12), max(flop(1024), 4.3e7 / 4.3e12)
  want_a = (f"| 512 | 4096→1024 | adamw | {ms(fa32)} / {ms(fa8)} / — | "
            f"0.050 / 0.090 / — | 0.080 | 0.040 / — / — | 1.25x / — / — | "
            f"{fa32 / 4e-5 * 100:.0f}% / — / — | 1980 / ? / — |")
  fb32, fb8 = max(flop(4096), 4.3e8 / 4.3e12), max(flop(4096), 4.3e7 / 4.3e12)
  want_b = (f"| 512 | 4096→4096 | adamw | {ms(fb32)} / {ms(fb8)} / — | "
            f"0.200 / 0.300 / — | 0.080 | 0.100 / 0.200 / — | 2.00x / 1.50x / — | "
            f"{fb32 / 1e-4 * 100:.0f}% / {fb8 / 2e-4 * 100:.0f}% / — | "
            f"1900 / 1800 / — |")
  assert want_a in out and want_b in out, out


def test_table_from_a_log_without_rows_is_refused(tmp_path):
  log = tmp_path / "bench.log"
  log.write_text("measured peaks: 791 TFLOP/s (bf16 8192³ matmul), 4.16 TB/s\n")
  with pytest.raises(SystemExit, match="holds no rows"):
    bench_fused_dw.main(["--table-from", str(log), "--peaks", "measured"])
