"""experiments/peak_report: what XLA says is live at a compiled step's peak."""

import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from experiments import memory_llama
from experiments import peak_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Steps compiled in a process of their own (the dump flags must be set before
# jax starts), each a module of its own name:
# - step: its peak holds a (512, 2048) fp32 matmul result (4 MiB, read again
#   after the next matmul) beside its three arguments of 0.5-2 MiB;
# - while_step: a while loop's result (a "phi" value in XLA's buffer
#   assignment) still live at the peak after the loop;
# - scan_step: the peak inside a scan's body, where the body's own parameters
#   (not the step's) and an in-place sort's operand and result (one buffer)
#   are live;
# - donate_step: donated (w, m) written in place, the old w dead at the peak.
_STEPS = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    r = np.random.default_rng(0)
    rnd = lambda *s: jnp.asarray(r.standard_normal(s), jnp.float32)

    def step(x, w1, w2):
      a = x @ w1
      return (jnp.tanh(a) @ w2).sum() + a[0, 0]

    def while_step(x, w, big):
      def body(c):
        i, a = c
        return i + 1, jnp.tanh(a @ w)
      i, a = lax.while_loop(lambda c: c[0] < 3, body, (0, x))
      b = jnp.sort(a @ big, axis=1)
      return jnp.sort(b * 2, axis=0).sum() + b[0, 0] + a[3, 3] + i

    def scan_step(x, ws):
      def body(c, w):
        a, b = c
        t = jnp.sort(a @ w, axis=1)
        return (jnp.tanh(t[:, :512]) + b, a), t[0].sum()
      (a, b), ys = lax.scan(body, (x, x * 2), ws)
      return a.sum() + b.sum() + ys.sum()

    def donate_step(state, b):
      w, m = state
      a = b @ w
      return (w - 0.1 * (b.T @ a), m * 0.9), (jnp.tanh(a) @ w).sum()

    out = {}
    for f, args, donate in (
        (step, (rnd(512, 256), rnd(256, 2048), rnd(2048, 64)), ()),
        (while_step, (rnd(256, 512), rnd(512, 512), rnd(512, 4096)), ()),
        (scan_step, (rnd(256, 512), rnd(3, 512, 4096)), ()),
        (donate_step, ((rnd(512, 512), rnd(512, 512)), rnd(256, 512)), (0,))):
      ma = jax.jit(f, donate_argnums=donate).lower(*args).compile().memory_analysis()
      out["jit_" + f.__name__] = dict(temp=ma.temp_size_in_bytes,
                                      argument=ma.argument_size_in_bytes)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def step_dump(tmp_path_factory):
  dump = str(tmp_path_factory.mktemp("dump"))
  env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} "
             "--xla_dump_hlo_module_re=jit_.*step", JAX_PLATFORMS="cpu",
             JAX_ENABLE_COMPILATION_CACHE="false")  # XLA must compile: dump
  out = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True,
                       text=True, env=env, check=True, cwd=ROOT)
  return dump, json.loads(out.stdout.strip().splitlines()[-1])


def test_the_report_finds_the_largest_temporaries(step_dump):
  dump, sizes = step_dump
  temp_bytes = sizes["jit_step"]["temp"]
  report = peak_report.summarize(dump)
  others = report.others()
  assert not any(v.parameter or v.buffer == "argument" for v in others)
  assert others[0].shape == "f32[512,2048]" and others[0].buffer == "temp"
  assert others[0].bytes == 512 * 2048 * 4
  assert "dot_general" in others[0].op_name or "tanh" in others[0].op_name
  assert not others[0].op_name.startswith("jit(")  # the step's prefix dropped
  assert all(v.bytes < others[0].bytes for v in others[1:] if v.shape != others[0].shape)
  # The arguments are told apart and sit in argument buffers; what the temp
  # allocation holds at the peak fits in the allocation XLA reports.
  params = [v for v in report.values if v.parameter]
  assert params and all(v.buffer == "argument" for v in params)
  assert 0 < report.bytes_in("temp") <= temp_bytes
  assert report.parameter_bytes + report.other_bytes == report.live_bytes
  assert 0 <= report.peak_index < report.schedule_length
  text = peak_report.format_report(report, top=2)
  assert "f32[512,2048]" in text and "peak at instruction" in text
  assert len(others) > 2
  listed = text.split("largest values")[1].split("the same by operation")[0]
  assert len(listed.strip().splitlines()) == 1 + 2  # the heading and `top` rows


@pytest.mark.parametrize("module", ["jit_while_step", "jit_scan_step"])
def test_values_of_loops_are_placed_and_counted_once(step_dump, module):
  dump, sizes = step_dump
  report = peak_report.summarize(dump, module)
  assert report.module.split(".")[1] == module
  # Every value has its buffer (a while loop's result is a "phi" value in the
  # buffer assignment); only the step's own arguments count as parameters,
  # not the loop body's.
  assert all(v.buffer != "?" for v in report.values)
  assert all(v.buffer == "argument" for v in report.values if v.parameter)
  assert any(v.name.startswith("while") for v in report.values) or module != "jit_while_step"
  # One buffer, two values (an in-place op's operand and result) counts once:
  # the temp live at the peak fits in the temp allocation.
  assert 0 < report.bytes_in("temp") <= sizes[module]["temp"]
  slots = collections.Counter(v.slot for v in report.values)
  if module == "jit_scan_step":
    assert max(slots.values()) > 1
    assert sum(v.bytes for v in report.values) > report.live_bytes
    # ... while values at other offsets of the temp allocation all count.
    temps = [v for v in report.values if v.buffer == "temp"]
    assert len({v.slot for v in temps}) > 2
    assert report.bytes_in("temp") > max(v.bytes for v in temps)


def test_donated_arguments_overwritten_in_place(step_dump):
  dump, sizes = step_dump
  report = peak_report.summarize(dump, "jit_donate_step")
  assert report.bytes_in("argument") <= sizes["jit_donate_step"]["argument"]
  # Donated arguments (maybe-live-out) are still argument buffers.
  assert all(v.buffer == "argument" for v in report.values if v.parameter)
  # The new w sits in the old w's buffer while the old w is dead: in an
  # argument buffer, but not a live argument of the step.
  assert report.parameter_bytes < report.bytes_in("argument")


def test_nested_tuple_elements_and_module_choice(tmp_path):
  shape = "((f32[8], f32[16]), (f32[64], f32[128]), s8[3])"
  assert [peak_report._tuple_element(shape, i) for i in ("0,1", "1,0", "1,1", "2")] == [
      "f32[16]", "f32[64]", "f32[128]", "s8[3]"]
  assert peak_report._tuple_element(shape, "3") == ""
  # The latest compile of exactly the module asked for, numerically.
  for name in ("module_9999.jit_step", "module_10001.jit_step",
               "module_10002.jit_step_eval", "module_10003.jit_other_step"):
    (tmp_path / f"{name}.cpu_after_optimizations-live-range.txt").write_text("x")
  live, hlo = peak_report.find_dump(str(tmp_path))
  assert os.path.basename(live).startswith("module_10001.jit_step.")
  assert hlo.endswith("module_10001.jit_step.cpu_after_optimizations.txt")


def test_layers_are_grouped():
  v = lambda name, op, b: peak_report.Value(name, "", b, "f32[4]", op, False, "temp", (0, b))  # noqa: E731
  report = peak_report.PeakReport("m", 1, 3, ("a", "b", "c"), (
      v("a", "x/layers_3/mlp/mul", 64), v("b", "x/layers_12/mlp/mul", 32),
      v("c", "x/head/mul", 16)))
  assert report.grouped() == [("x/layers_N/mlp/mul", 96, 2), ("x/head/mul", 16, 1)]


def test_without_the_hlo_the_report_says_what_it_cannot_tell(step_dump, tmp_path):
  dump, _ = step_dump
  live, _ = peak_report.find_dump(dump)
  shutil.copy(live, tmp_path)
  report = peak_report.summarize(str(tmp_path))
  assert not report.hlo_found and report.parameter_bytes == 0
  assert "no optimized HLO" in peak_report.format_report(report)


def test_a_directory_without_a_dump_is_refused_with_the_flags_to_set(tmp_path):
  with pytest.raises(FileNotFoundError, match="--xla_dump_to=.*jit_step"):
    peak_report.summarize(str(tmp_path))
  (tmp_path / "module_1.jit_step.cpu-live-range.txt").write_text("HloLiveRange\n")
  with pytest.raises(ValueError, match="no 'Live ranges at N"):
    peak_report.summarize(str(tmp_path))


def test_memory_llama_writes_a_peak_report_per_variant(tmp_path):
  rows = memory_llama.main(
      ["--model", "cpu-tiny", "--tokens", "16", "--optimizers", "forge-int8",
       "--layouts", "unrolled+remat", "--steps", "1", "--peak-report",
       "--layers", "1", "--out", str(tmp_path)])  # one block: the same path
  peak = rows[0]["peak_live"]
  assert "error" not in rows[0] and "error" not in peak
  assert os.path.exists(peak["path"])
  assert "+" not in os.path.basename(peak["path"])  # a plain file name
  assert "live at the peak" in open(peak["path"]).read()
  assert 0 < peak["by_buffer"]["temp"] <= rows[0]["temp_size_in_bytes"]
  assert 0 < peak["parameter_bytes"] <= rows[0]["argument_size_in_bytes"]
  assert peak["top"] and all(b > 0 for b, _, _ in peak["top"])
  tp = peak["temp_peak"]
  assert tp["allocation_bytes"] == rows[0]["temp_size_in_bytes"]
  assert 0 < tp["live_bytes"] <= tp["allocation_bytes"] and tp["top"]
  saved = json.load(open(glob.glob(str(tmp_path / "memory_*.json"))[0]))
  assert saved[0]["peak_live"] == peak


def test_peak_report_children_compile_and_dump(monkeypatch, tmp_path):
  # A step read from a persistent compilation cache (a user's, or this test
  # session's) is not compiled, so XLA would write no dump: the child runs
  # without it, with the dump flags added to the caller's own XLA_FLAGS.
  seen = []

  def fake_run(cmd, **kw):
    seen.append(kw["env"])
    return types.SimpleNamespace(stdout="", stderr="ValueError: not run")

  monkeypatch.setattr(memory_llama.subprocess, "run", fake_run)
  monkeypatch.setenv("XLA_FLAGS", "--xla_foo=1")
  rows = memory_llama.main(["--model", "cpu-tiny", "--tokens", "16", "--optimizers",
                            "optax", "--layouts", "scan", "--peak-report",
                            "--out", str(tmp_path)])
  env = seen[0]
  assert env["JAX_ENABLE_COMPILATION_CACHE"] == "false"
  assert env["XLA_FLAGS"].startswith("--xla_foo=1 --xla_dump_to=")
  assert "--xla_dump_hlo_module_re=jit_step" in env["XLA_FLAGS"]
  dump = env["XLA_FLAGS"].split("--xla_dump_to=")[1].split()[0]
  assert not os.path.exists(dump)  # removed after the variant
  assert "peak_live" not in rows[0]  # the variant failed: no report


def test_xla_made_values_are_named_by_their_user(step_dump):
  # XLA's own instructions (copies, constants) carry no JAX op name; the
  # report names them by the first user that has one.
  dump, _ = step_dump
  report = peak_report.summarize(dump, "jit_scan_step")
  named = [v.op_name for v in report.values if " -> " in v.op_name]
  assert any(op.startswith("copy -> ") and "while" in op for op in named)
  assert not any("jit(" in op.split(" -> ")[-1][:4] for op in named)


def test_the_command_line_picks_or_asks_for_the_module(step_dump, tmp_path, capsys):
  dump, _ = step_dump
  assert peak_report.main([dump]).module.split(".")[1] == "jit_step"
  for f in glob.glob(os.path.join(dump, "*jit_scan_step*.txt")):
    shutil.copy(f, tmp_path)
  # One module, whatever its name: that one.
  assert peak_report.main([str(tmp_path)]).module.split(".")[1] == "jit_scan_step"
  for f in glob.glob(os.path.join(dump, "*jit_while_step*.txt")):
    shutil.copy(f, tmp_path)
  capsys.readouterr()
  with pytest.raises(SystemExit):  # several, none jit_step: it asks
    peak_report.main([str(tmp_path)])
  err = capsys.readouterr().err
  assert "jit_scan_step" in err and "jit_while_step" in err and "--module" in err
  # A module or a directory that is not there: one line saying so, no traceback.
  for args, says in (([str(tmp_path), "--module", "jit_nothing"], "jit_nothing"),
                     ([str(tmp_path / "absent")], "is not a directory")):
    with pytest.raises(SystemExit):
      peak_report.main(args)
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.parametrize("module", ["jit_step", "jit_while_step", "jit_scan_step",
                                    "jit_donate_step"])
def test_the_temp_allocations_own_peak(step_dump, module):
  dump, sizes = step_dump
  tp = peak_report.summarize(dump, module).temp_peak
  # The allocation is the one memory_analysis() reports; no moment holds more
  # than it, and what is listed there adds up to the maximum.
  assert tp.allocation_bytes == sizes[module]["temp"]
  assert 0 < tp.live_bytes <= tp.allocation_bytes
  assert tp.values and all(v.buffer == "temp" for v in tp.values)
  assert peak_report._distinct_bytes(tp.values) == tp.live_bytes
  text = peak_report.format_report(peak_report.summarize(dump, module))
  assert "temp allocation: " in text and f"at instruction {tp.index} " in text


def test_the_temp_peak_merges_a_shared_buffer_and_reuses_offsets(tmp_path):
  # A hand-made dump. Offset 0 holds a (12 bytes, live 1-2), then c (8 bytes,
  # 4-6) after a is dead; offset 16 holds b (16 bytes, 2-5) and, in place,
  # its result b2 (16 bytes, 5-7): one buffer. d (4 bytes, 6-6) is at 32.
  # Live temp: t=2: a+b = 28; t=4,5: c+b = 24; t=6: c+b2+d = 28; the first
  # maximum is at 2. The parameter p sits in an argument buffer.
  name = "module_7.jit_step.cpu_after_optimizations"
  (tmp_path / f"{name}-buffer-assignment.txt").write_text(textwrap.dedent("""\
      BufferAssignment:
      allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:
       value: <1 p @0> (size=64,offset=0): f32[16]{0}
      allocation 1: size 36, preallocated-temp:
       value: <2 a @0> (size=12,offset=0): f32[3]{0}
       value: <3 c @0> (size=8,offset=0): f32[2]{0}
       value: <4 b @0> (size=16,offset=16): f32[4]{0}
       value: <5 b2 @0> (size=16,offset=16): f32[4]{0}
       value: <6 d @0> (size=4,offset=32): f32[]
      """))
  (tmp_path / f"{name}-live-range.txt").write_text(textwrap.dedent("""\
      HloLiveRange (max 8):
        InstructionSequence:
          0:p
          1:a
          2:b
          3:x
          4:c
          5:b2
          6:d
          7:r
        BufferLiveRange:
          p{}:0-7
          a{}:1-2
          b{}:2-5
          c{}:4-6
          b2{}:5-7
          d{}:6-6
        Live ranges at 2 (peak):
          p{}: 64 bytes (cumulative: 64 bytes)
          b{}: 16 bytes (cumulative: 80 bytes)
          a{}: 12 bytes (cumulative: 92 bytes)
      """))
  report = peak_report.summarize(str(tmp_path))
  tp = report.temp_peak
  assert (tp.allocation_bytes, tp.live_bytes, tp.index) == (36, 28, 2)
  assert sorted(v.name for v in tp.values) == ["a", "b"]
  assert report.bytes_in("argument") == 64 and report.bytes_in("temp") == 28
  # Without b2 merged into b (one buffer), t=5 would count 40 > 36.
  text = peak_report.format_report(report)
  assert "temp allocation: 36 B; the most of it live at once: 28 B, at instruction 2 (b)" in text
  assert "8 B of it is never live together" in text


def test_the_temp_peak_of_small_values_two_allocations_and_nested_ranges(tmp_path):
  # A hand-made dump whose values are smaller than the schedule is long.
  # Offset 0 of allocation 1 holds e (8 bytes, live 2-20) and, in place
  # within e's range, f (12 bytes, 4-5): one buffer, 12 bytes while both
  # live. g (4 bytes, 6) sits at 12; allocation 2 (6 bytes) holds h (20-25)
  # on a line without its size (the allocation's). Live temp: t=4,5: 12;
  # t=6: 8+4 = 12; t=20: 8+6 = 14, the maximum.
  name = "module_3.jit_step.cpu_after_optimizations"
  (tmp_path / f"{name}-buffer-assignment.txt").write_text(textwrap.dedent("""\
      BufferAssignment:
      allocation 1: size 20, preallocated-temp:
       value: <2 e @0> (size=8,offset=0): f32[2]{0}
       value: <3 f @0> (size=12,offset=0): f32[3]{0}
       value: <4 g @0> (size=4,offset=12): f32[]
      allocation 2: size 6, preallocated-temp:
       value: <5 h @0>: s8[6]{0}
      """))
  sequence = "".join(f"    {i}:i{i}\n" for i in range(30))
  (tmp_path / f"{name}-live-range.txt").write_text(
      "HloLiveRange (max 30):\n  InstructionSequence:\n" + sequence +
      textwrap.dedent("""\
        BufferLiveRange:
          e{}:2-20
          f{}:4-5
          g{}:6-6
          h{}:20-25
        Live ranges at 20 (peak):
          e{}: 8 bytes (cumulative: 8 bytes)
          h{}: 6 bytes (cumulative: 14 bytes)
      """))
  tp = peak_report.summarize(str(tmp_path)).temp_peak
  assert (tp.allocation_bytes, tp.live_bytes, tp.index) == (26, 14, 20)
  assert [(v.name, v.bytes) for v in tp.values] == [("e", 8), ("h", 6)]
  assert peak_report._distinct_bytes(tp.values) == tp.live_bytes
