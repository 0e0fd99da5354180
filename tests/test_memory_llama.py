"""The model-scale memory experiment runs end to end on a tiny model (CPU)."""

import types

import jax
import jax.numpy as jnp
import pytest

from conftest import ON_GPU
from experiments import memory_llama


@pytest.fixture(scope="module")
def full_rows():
  """Two rows of the whole cpu-tiny model (every block): the optax baseline
  unrolled, and fused folded int8 moments scanned with remat. Shared: each
  variant's compile is most of a test's time."""
  return (memory_llama.run_one("cpu-tiny", 16, "optax", "unrolled", steps=2),
          memory_llama.run_one("cpu-tiny", 16, "forge-fold-int8", "scan+remat",
                               steps=2))


def test_variants_run_and_report_memory_and_state(capsys, full_rows):
  optax_row, int8_row = full_rows
  assert int8_row["fused_embedding"] and not optax_row["fused_embedding"]
  for row in (optax_row, int8_row):
    assert row["temp_size_in_bytes"] > 0 and row["argument_size_in_bytes"] > 0
    assert row["step_s"] > 0 and row["loss"] == row["loss"]  # finite, not NaN
    assert row["pipelined_step_s"] > 0  # 4 more steps, dispatched back to back
    assert all(row[k] > 0 for k in ("init_s", "lower_s", "compile_s"))
    # The timed steps run the step compiled above: its first call does not
    # lower (and compile) it again (stop 42: the unrolled rows did).
    assert row["step_lowerings"] == 1, row["layout"]
  # bf16 Adam moments: 2 bytes x 2 per param; int8 folded (l=3) moments for the
  # projections and int8 for the rest: well under a quarter of that.
  assert int8_row["optimizer_state_bytes"] < 0.3 * optax_row["optimizer_state_bytes"]
  # The table: success and error rows have the header's columns; the last
  # column holds the three phase times.
  capsys.readouterr()
  memory_llama.print_table([optax_row, dict(optax_row, error="timeout after 9 s in init")])
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("|")]
  assert len({l.count("|") for l in lines}) == 1, lines
  assert lines[0].rstrip(" |").endswith("init / lower / compile s")
  assert len(lines[2].rstrip(" |").split("|")[-1].split("/")) == 3


def test_compile_first_compiles_with_no_state_on_the_device(monkeypatch, capsys,
                                                           full_rows):
  # XLA's GPU autotuner allocates buffers of its own while the step
  # compiles, and peak_bytes_in_use keeps that high-water mark. With
  # compile_first the step is compiled before the state exists: the device
  # then holds only the batch and the init key while XLA compiles, and the
  # steps after are the same program as the default order's.
  # Live bytes are counted as the increase over what lived before each
  # run: arrays that other tests left alive do not count.
  live_at_compile, before = [], []
  compile_ = jax.stages.Lowered.compile

  def live_bytes():
    return sum(x.nbytes for x in jax.live_arrays())

  def spy(self, *args, **kwargs):
    live_at_compile.append(live_bytes() - before[-1])
    return compile_(self, *args, **kwargs)

  monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
  before.append(live_bytes())
  first = memory_llama.run_one("cpu-tiny", 16, "forge-fold-int8", "scan+remat",
                               steps=2, compile_first=True)
  before.append(live_bytes())
  default = memory_llama.run_one("cpu-tiny", 16, "forge-fold-int8", "scan+remat",
                                 steps=1, pipelined=0)
  assert len(live_at_compile) == 2
  whole = default["param_bytes"] + default["optimizer_state_bytes"]
  assert live_at_compile[0] < 0.01 * whole < whole <= live_at_compile[1]
  assert first["compile_first"] and not default["compile_first"]
  assert "compiled before the state" in memory_llama._layout_label(first)
  assert first["step_lowerings"] == 1
  assert first["setup_s"] > 0 and default["setup_s"] is None
  _, int8_row = full_rows  # the same variant, compiled after its init
  for k in ("argument_size_in_bytes", "param_bytes", "optimizer_state_bytes"):
    assert first[k] == int8_row[k], k
  if ON_GPU:  # the autotuner may pick other kernels in another compile
    assert first["losses"] == pytest.approx(int8_row["losses"], rel=1e-2)
    assert first["compile_peak_bytes"] > 0
  else:  # one program: the same values and buffers
    assert first["losses"] == int8_row["losses"]
    for k in ("temp_size_in_bytes", "hlo"):
      assert first[k] == int8_row[k], k
    assert first["compile_peak_bytes"] is None  # no memory_stats on the CPU
  with pytest.raises(ValueError, match="compile_first=True needs tp=1"):
    memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "scan+remat", tp=2,
                         compile_first=True)
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    memory_llama.main(["--model", "cpu-tiny", "--tp", "2", "--compile-first"])
  assert e.value.code == 2
  assert "--compile-first needs --tp 1" in capsys.readouterr().err


@pytest.mark.skipif(len(jax.devices()) < 2, reason="needs two devices of the "
                    "default backend (CI: two host CPUs)")
def test_tensor_parallel_variant_runs_sharded():
  row = memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "scan+remat", steps=2,
                             tp=2)
  assert row["tp"] == 2 and row["loss"] == row["loss"]
  assert row["step_lowerings"] == 1  # compiled once (see the test above)
  assert not row["fused_embedding"]  # replicated under TP: unfused
  # Each device holds half of the projections and their moments: the
  # arguments of the sharded step (per device) are well under the whole's.
  whole = row["param_bytes"] + row["optimizer_state_bytes"]
  assert row["argument_size_in_bytes"] < 0.8 * whole


def test_variant_processes_may_use_the_whole_card(monkeypatch, tmp_path):
  # Qwen3-32B with int8 moments needs 130 of an H200's 140 GiB: JAX's default
  # allocator cap (75%) would fail it. A caller's own setting wins.
  seen = []

  def fake_run(cmd, **kw):
    seen.append(kw["env"].get("XLA_PYTHON_CLIENT_MEM_FRACTION"))
    return types.SimpleNamespace(stdout="", stderr="ValueError: not run")

  monkeypatch.setattr(memory_llama.subprocess, "run", fake_run)
  argv = ["--model", "cpu-tiny", "--tokens", "16", "--optimizers", "optax",
          "--layouts", "scan", "--out", str(tmp_path)]
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  rows = memory_llama.main(argv)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  memory_llama.main(argv)
  assert seen == ["0.97", "0.5"]
  assert rows[0]["error"] == "ValueError: not run"


def test_a_timeout_names_the_phase_it_stopped_in():
  out = b"PHASE init 35.2\nsome log line\nPHASE lower 12.0\n"
  assert memory_llama.timeout_error(200, out) == (
      "timeout after 200 s in compile (init 35.2 s, lower 12.0 s done)")
  assert memory_llama.timeout_error(90, None) == "timeout after 90 s in init"
  assert memory_llama.timeout_error(90, "PHASE init 1.0\nPHASE lower 2.0\n"
                                    "PHASE compile 3.0\n").startswith(
                                        "timeout after 90 s in steps (init 1.0 s")


def test_a_crash_names_the_phase_it_failed_in():
  assert memory_llama.crash_error("ValueError: x", "") == "ValueError: x"
  assert memory_llama.crash_error("RuntimeError: oom", "PHASE init 4.0\n") == (
      "RuntimeError: oom (in lower; init 4.0 s done)")


def test_the_embedding_may_stay_unfused():
  row = memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "unrolled", steps=1,
                             embedding="unfused")
  assert not row["fused_embedding"] and row["loss"] == row["loss"]
  assert "ForgeEmbed" not in memory_llama._layout_label(row)
  assert "ForgeEmbed" in memory_llama._layout_label(dict(row, fused_embedding=True))
  # implementation='xla' runs no kernel: the label says so.
  xla = memory_llama._layout_label(dict(row, implementation="xla"))
  assert "unfused in the backward" in xla and "kernel" not in xla
  with pytest.raises(ValueError, match="embedding='none'"):
    memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "unrolled", embedding="none")


def test_layer_leaves_name_a_layer_alike_in_every_layout():
  import numpy as np  # pylint: disable=g-import-not-at-top
  stacked = {"layers": {"block": {"attn": {"q_proj": {"kernel": np.arange(6.).reshape(2, 3)}}}},
             "norm": {"scale": np.ones(3)}}
  unrolled = {"layers_0": {"attn": {"q_proj": {"kernel": np.arange(3.)}}},
              "layers_1": {"attn": {"q_proj": {"kernel": np.arange(3., 6.)}}},
              "norm": {"scale": np.ones(3)}}
  a, b = memory_llama.layer_leaves(stacked), memory_llama.layer_leaves(unrolled)
  assert sorted(a) == sorted(b) == ["layers[0]/attn/q_proj/kernel",
                                    "layers[1]/attn/q_proj/kernel", "norm/scale"]
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])


def test_a_cut_model_trains_alike_scanned_and_unrolled(capsys, full_rows):
  # --layers keeps that many blocks at the preset's widths; each row records
  # its loss per step, which scanned and unrolled layouts of one model share
  # (same init through the scanned twin, same batch): fp32 rounding apart.
  rows = [memory_llama.run_one("cpu-tiny", 16, "forge-int8", layout, steps=3,
                               layers=1, movement=True)
          for layout in ("scan+remat", "unrolled")]
  for row in rows:
    assert row["n_layers"] == 1 and len(row["losses"]) == 3
    assert row["losses"][-1] == row["loss"] and row["losses"][2] < row["losses"][0]
  assert rows[0]["losses"] == pytest.approx(rows[1]["losses"], rel=1e-4)
  # Every param's movement, per layer, under one key in both layouts.
  moved = rows[0]["movement"]
  assert set(moved) == set(rows[1]["movement"])
  assert "layers[0]/attn/q_proj/kernel" in moved and "lm_head/kernel" in moved
  assert moved["layers[0]/attn/q_proj/kernel"] > 0
  for k, v in moved.items():
    assert rows[1]["movement"][k] == pytest.approx(v, rel=2e-2, abs=1e-9), k
  # A row of the whole model (no --layers): no n_layers, every block's params.
  for full in full_rows:
    assert "n_layers" not in full and full["params"] > rows[0]["params"]
  capsys.readouterr()
  memory_llama.print_table(rows)
  memory_llama.print_losses(rows + [dict(rows[0], error="timeout")])
  out = capsys.readouterr().out
  assert "| cpu-tiny (1 layer) |" in out
  losses = [l for l in out.splitlines() if l.startswith("  cpu-tiny (1 layer) T=16")]
  assert len(losses) == 2 and losses[0].endswith(
      " ".join(f"{v:.4f}" for v in rows[0]["losses"]))
  # The unrolled variables came from the scanned twin (the same weights).
  assert rows[1]["init"] == "scanned twin" and rows[0]["init"] == "direct"
  # A doubled update, a lost one in the first row, a param only the second
  # row has: each marked.
  first = dict(moved, **{"norm/scale": 0.0})
  second = dict(moved, **{"lm_head/kernel": 2 * moved["lm_head/kernel"],
                          "norm/scale": 1e-4, "extra/kernel": 1.0})
  memory_llama.print_movements([dict(rows[0], movement=first),
                                dict(rows[1], movement=second)])
  table = capsys.readouterr().out.splitlines()
  head = [l for l in table if l.startswith("| lm_head/kernel |")]
  assert len(head) == 1 and head[0].endswith("(×2.00) |")
  norm = [l for l in table if l.startswith("| norm/scale |")]
  assert len(norm) == 1 and norm[0].endswith("(first row: 0) |")
  extra = [l for l in table if l.startswith("| extra/kernel |")]
  assert len(extra) == 1 and extra[0].startswith("| extra/kernel | — | 1.000e+00")
  q = [l for l in table if l.startswith("| layers[0]/attn/q_proj/kernel |")]
  assert len(q) == 1 and "×" not in q[0]
  # Off the GPU 'auto' resolves to the XLA reference: the row says so.
  assert rows[0]["resolved_implementation"] == "xla"
  assert "update unfused in the backward" in memory_llama._layout_label(rows[0])
  for argv in (["--layers", "-1"], ["--model", "nosuch"], ["--steps", "0"],
               ["--tokens", "abc"], ["--tokens", "16,0"],
               ["--optimizers", "optax,nope"], ["--layouts", "rolled"]):
    with pytest.raises(SystemExit):  # refused before any variant starts
      memory_llama.main(["--model", "cpu-tiny", *argv, "--out", "/nonexistent/x"])
  with pytest.raises(SystemExit):
    memory_llama.main(["--model", "cpu-tiny", "--pipelined", "-1"])
  with pytest.raises(SystemExit):
    memory_llama.main(["--model", "cpu-tiny", "--compiler-options", "novalue"])
  with pytest.raises(ValueError, match="pipelined=-1 must be an int >= 0"):
    memory_llama.run_one("cpu-tiny", 16, "optax", "unrolled", pipelined=-1)
  for bad in (-1, 99):
    with pytest.raises(ValueError, match=f"layers={bad} must be in \\[0, "):
      memory_llama.run_one("cpu-tiny", 16, "forge-int8", "unrolled", layers=bad)


@pytest.mark.parametrize("moments", ["int8", "bfloat16"])
def test_unrolled_init_from_the_scanned_twin_has_the_unrolled_tree(moments):
  # memory_llama builds an unrolled model's variables by slicing its scanned
  # twin's stacks: the same tree, shapes and dtypes as the unrolled init,
  # layer i holding slice i of every stack (ForgeDense moments included).
  import functools  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import forge_jax as fj  # pylint: disable=g-import-not-at-top
  from forge_jax.models import llama  # pylint: disable=g-import-not-at-top
  cfg = llama.get_config("cpu-tiny", max_seq_len=16, remat=True)
  kw = dict(mu_dtype=jnp.dtype(moments), nu_dtype=jnp.dtype(moments))
  dense = functools.partial(fj.ForgeDense, optimizer=fj.adamw(1e-3, **kw))
  model = llama.Llama(cfg, dense_cls=dense)
  key, tokens = jax.random.key(3), jnp.zeros((1, 16), jnp.int32)
  got = memory_llama._unrolled_init(model, key, tokens)
  want = jax.eval_shape(model.init, key, tokens)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)
  scanned = jax.jit(llama.Llama(dataclasses.replace(cfg, scan_layers=True),
                                dense_cls=dense).init)(key, tokens)
  for coll in ("params", "forge_state"):
    for i in range(cfg.n_layers):
      for a, b in zip(jax.tree.leaves(got[coll][f"layers_{i}"]),
                      jax.tree.leaves(scanned[coll]["layers"]["block"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b[i]))
  assert cfg.n_layers >= 2
  assert got["forge_state"]["layers_1"]  # the fused layers' moments are there


def test_unrolled_init_frees_each_stack_before_putting_its_layers(monkeypatch):
  # The 8B init must not hold a stack twice on the device (stop 25: slicing
  # on the device put the forge-bf16 init peak 3.77 GiB above the
  # arguments). Each stack goes to the host and is deleted on the device
  # before any of its layers is put back.
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from forge_jax.models import llama  # pylint: disable=g-import-not-at-top
  cfg = llama.get_config("cpu-tiny", max_seq_len=16)
  model = llama.Llama(cfg)
  fetched, puts = [], []
  real_get, real_put = jax.device_get, jax.device_put

  def device_get(x):
    fetched.append(x)
    return real_get(x)

  def device_put(x, *args, **kwargs):
    puts.append(all(a.is_deleted() for a in fetched))
    return real_put(x, *args, **kwargs)

  monkeypatch.setattr(jax, "device_get", device_get)
  monkeypatch.setattr(jax, "device_put", device_put)
  got = memory_llama._unrolled_init(model, jax.random.key(0),
                                    jnp.zeros((1, 16), jnp.int32))
  n_stacks = len(jax.tree.leaves(got["params"]["layers_0"]))
  assert len(fetched) == n_stacks and len(puts) == n_stacks * cfg.n_layers
  assert all(puts)


def test_compiler_options_are_parsed_as_jax_jit_takes_them():
  parse = memory_llama.parse_compiler_options
  assert parse("") == {}
  assert parse("xla_gpu_enable_command_buffer=, a=TRUE,b=false,c=SKIP_TEMP") == {
      "xla_gpu_enable_command_buffer": "", "a": True, "b": False, "c": "SKIP_TEMP"}
  # An item without '=' continues the previous value (XLA's list options).
  assert parse("xla_gpu_enable_command_buffer=FUSION,CUBLAS, b=1") == {
      "xla_gpu_enable_command_buffer": "FUSION,CUBLAS", "b": "1"}
  assert parse(" , ") == {}
  import forge_jax as fj  # pylint: disable=g-import-not-at-top
  assert parse(" scan ") == dict(fj.SCAN_GPU_COMPILER_OPTIONS)
  for bad in ("novalue", "=1", "a=1,=2", "novalue,a=1"):
    with pytest.raises(ValueError, match="is not name=value"):
      parse(bad)
  with pytest.raises(ValueError, match="'a' is given twice"):
    parse("a=1,a=2")
  row = dict(layout="unrolled", compiler_options="xla_gpu_enable_command_buffer=")
  assert memory_llama._layout_label(row) == (
      "unrolled, XLA xla_gpu_enable_command_buffer=")


@pytest.mark.parametrize("optimizer", ["optax", "forge-bf16"])
def test_compiler_options_reach_both_optimizers_steps(optimizer):
  # A value XLA refuses fails the variant at compile time: the options reach
  # the step's jit (optax's own, fj.make_train_step's).
  with pytest.raises(Exception, match="xla_gpu_enable_dynamic_slice_fusion"):
    memory_llama.run_one("cpu-tiny", 16, optimizer, "unrolled", steps=1,
                         layers=1, compiler_options="xla_gpu_enable_dynamic_slice_fusion=maybe")


def test_rows_record_the_options_xla_got():
  # 'scan' is a label whose meaning changed (stop 37): the row keeps both.
  import forge_jax as fj  # pylint: disable=g-import-not-at-top
  row = memory_llama.run_one("cpu-tiny", 16, "optax", "unrolled", steps=1,
                             layers=1, pipelined=0, compiler_options="scan")
  assert row["compiler_options"] == "scan"
  assert row["xla_options"] == dict(fj.SCAN_GPU_COMPILER_OPTIONS)
  plain = memory_llama.run_one("cpu-tiny", 16, "optax", "unrolled", steps=1,
                               layers=1, pipelined=0)
  assert "xla_options" not in plain and "compiler_options" not in plain


def test_compiler_option_sets_reach_the_variant_processes(tmp_path):
  # Each set runs as its own child process (--one): the bad set's row fails
  # naming the option, the good one's row succeeds and records its set.
  rows = memory_llama.main([
      "--model", "cpu-tiny", "--tokens", "16", "--optimizers", "optax",
      "--layouts", "unrolled", "--steps", "1", "--layers", "1", "--pipelined", "0",
      "--out", str(tmp_path), "--compiler-options", "xla_gpu_enable_command_buffer=",
      "--compiler-options", "xla_gpu_enable_dynamic_slice_fusion=maybe"])
  assert [r.get("compiler_options") for r in rows] == [
      "xla_gpu_enable_command_buffer=", "xla_gpu_enable_dynamic_slice_fusion=maybe"]
  assert "error" not in rows[0] and "xla_gpu_enable_dynamic_slice_fusion" in rows[1]["error"]
  with pytest.raises(SystemExit):  # --one runs one variant under one set
    memory_llama.main(["--model", "cpu-tiny", "--one", "16:optax:unrolled",
                       "--compiler-options", "", "--compiler-options", "a=1"])


def test_a_fused_scan_row_saves_residuals_and_scan_remat_recomputes():
  # Since stop 43 a fused 'scan' row's backward (inplace_scan) reads the
  # residuals its forward saved; 'scan+remat' recomputes each block. Same
  # model, init and batch: the same losses, up to rounding.
  saved, remat = (memory_llama.run_one("cpu-tiny", 16, "forge-bf16", layout,
                                       steps=2, layers=2, pipelined=0)
                  for layout in ("scan", "scan+remat"))
  assert (saved["scan_backward"], remat["scan_backward"]) == ("saved", "remat")
  for a, b in zip(saved["losses"], remat["losses"]):
    assert abs(a - b) <= 1e-3 * abs(b), (saved["losses"], remat["losses"])
  # The residual stacks the forward saved (traced: scan_residuals) are in
  # the compiled step's temp.
  from experiments import scan_residuals  # pylint: disable=g-import-not-at-top
  kept = scan_residuals.measure("cpu-tiny", 16, "forge-bf16", "scan")
  assert kept["per_block_bytes"] > 16 * 128 * 2  # more than a block's input
  assert saved["temp_size_in_bytes"] >= 2 * kept["per_block_bytes"]
  # Rows from before (no scan_backward key) say that they rematerialized.
  old = {k: v for k, v in saved.items() if k != "scan_backward"}
  assert "block rematerialized" in memory_llama._layout_label(old)
  assert "rematerialized" not in memory_llama._layout_label(saved)
  optax_row = dict(old, optimizer="optax")
  assert "rematerialized" not in memory_llama._layout_label(optax_row)


def test_a_mosaic_tile_replaces_the_default_for_bf16_ops_it_covers(monkeypatch):
  from experiments import probe_mosaic
  from forge_jax import rules
  from pallas_kernels.fused_dw import api
  default = api.mosaic_default_config
  monkeypatch.setattr(api, "mosaic_default_config", default)  # restored after
  def op(t, d_in, d_out, dtype):
    s = lambda *shape: jax.ShapeDtypeStruct(shape, dtype)
    return s(t, d_in), s(t, d_out), s(d_in, d_out), (s(d_in, d_out),
                                                     s(d_in, d_out))
  bf16 = op(512, 256, 384, jnp.bfloat16)
  fp32 = op(512, 256, 384, jnp.float32)
  before = [default(*a, rules.ADAMW, None) for a in (bf16, fp32)]
  memory_llama.use_mosaic_tile("m128n128t64s3x3")
  tile = probe_mosaic.CONFIGS["m128n128t64s3x3"]
  assert before[0] != tile
  assert api.mosaic_default_config(*bf16, rules.ADAMW, None) == tile
  # fp32 W and states keep the default
  assert api.mosaic_default_config(*fp32, rules.ADAMW, None) == before[1]
  # int8 states (no .dtype of their own) keep theirs
  from pallas_kernels import quantization
  keys = jax.random.split(jax.random.key(3), 2)
  int8 = (*bf16[:3], tuple(
      quantization.quantize(jax.random.normal(k, (256, 384)) ** 2 * 1e-3, True)
      for k in keys))
  assert (api.mosaic_default_config(*int8, rules.ADAMW, None)
          == default(*int8, rules.ADAMW, None))
  with pytest.raises(ValueError, match="mosaic tile 'nope'"):
    memory_llama.use_mosaic_tile("nope")


def test_the_mosaic_tile_option_is_checked_and_recorded(tmp_path):
  with pytest.raises(SystemExit):  # refused before any variant starts
    memory_llama.main(["--model", "cpu-tiny", "--mosaic-tile", "nope",
                       "--out", str(tmp_path)])
  rows = memory_llama.main([
      "--model", "cpu-tiny", "--tokens", "16", "--optimizers", "optax,forge-bf16",
      "--layouts", "unrolled", "--steps", "1", "--layers", "1",
      "--pipelined", "0", "--out", str(tmp_path),
      "--mosaic-tile", "m128n128t64s3x3"])
  assert [r.get("mosaic_tile") for r in rows] == [None, "m128n128t64s3x3"]
  assert all("error" not in r for r in rows)
  memory_llama.print_table(rows)
