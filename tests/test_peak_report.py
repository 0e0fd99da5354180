"""experiments/peak_report: what XLA says is live at a compiled step's peak."""

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

# A step whose peak holds a (512, 2048) fp32 matmul result (4 MiB, read again
# after the next matmul) beside its three arguments of 0.5-2 MiB; the dump
# flags must be set before jax starts, so it runs in a process of its own.
_STEP = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    def step(x, w1, w2):
      a = x @ w1
      return (jnp.tanh(a) @ w2).sum() + a[0, 0]
    r = np.random.default_rng(0)
    args = [jnp.asarray(r.standard_normal(s), jnp.float32)
            for s in ((512, 256), (256, 2048), (2048, 64))]
    c = jax.jit(step).lower(*args).compile()
    print(c.memory_analysis().temp_size_in_bytes)
""")


@pytest.fixture(scope="module")
def step_dump(tmp_path_factory):
  dump = str(tmp_path_factory.mktemp("dump"))
  env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} "
             "--xla_dump_hlo_module_re=jit_step", JAX_PLATFORMS="cpu",
             JAX_ENABLE_COMPILATION_CACHE="false")  # XLA must compile: dump
  out = subprocess.run([sys.executable, "-c", _STEP], capture_output=True,
                       text=True, env=env, check=True, cwd=ROOT)
  return dump, int(out.stdout.split()[-1])


def test_the_report_finds_the_largest_temporaries(step_dump):
  dump, temp_bytes = step_dump
  report = peak_report.summarize(dump)
  others = report.others()
  assert others[0].shape == "f32[512,2048]" and others[0].buffer == "temp"
  assert others[0].bytes == 512 * 2048 * 4
  assert "dot_general" in others[0].op_name or "tanh" in others[0].op_name
  assert all(v.bytes < others[0].bytes for v in others[1:] if v.shape != others[0].shape)
  # The arguments are told apart and sit in argument buffers; what the temp
  # allocation holds at the peak fits in the allocation XLA reports.
  params = [v for v in report.values if v.parameter]
  assert params and all(v.buffer == "argument" for v in params)
  assert 0 < report.bytes_in("temp") <= temp_bytes
  assert report.parameter_bytes + report.other_bytes == sum(v.bytes for v in report.values)
  assert 0 <= report.peak_index < report.schedule_length
  text = peak_report.format_report(report, top=5)
  assert "f32[512,2048]" in text and "peak at instruction" in text


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
       "--layouts", "unrolled", "--steps", "1", "--peak-report",
       "--out", str(tmp_path)])
  peak = rows[0]["peak_live"]
  assert "error" not in rows[0] and "error" not in peak
  assert os.path.exists(peak["path"])
  assert "live at the peak" in open(peak["path"]).read()
  assert 0 < peak["by_buffer"]["temp"] <= rows[0]["temp_size_in_bytes"]
  assert 0 < peak["parameter_bytes"] <= rows[0]["argument_size_in_bytes"]
  assert peak["top"] and all(b > 0 for b, _, _ in peak["top"])
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
