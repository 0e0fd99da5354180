"""The profile summary sums a trace's device kernels by kind (CPU)."""

import gzip
import json

import pytest

from experiments import memory_llama
from experiments import profile_summary


def _write_trace(path, events):
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)


def test_gpu_stream_kernels_are_summed_by_category(tmp_path):
  meta = [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
      {"ph": "M", "pid": 7, "name": "process_name",
       "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "pid": 7, "tid": 3, "name": "thread_name",
       "args": {"name": "Stream #13(Compute)"}},
      {"ph": "M", "pid": 7, "tid": 9, "name": "thread_name",
       "args": {"name": "XLA Ops"}},
  ]
  kernels = [("forge_fused_dw_adamw_mosaic", 300.0), ("forge_fused_dw_adamw_mosaic", 100.0),
             ("sm90_xmma_gemm_bf16bf16_bf16f32", 250.0), ("nvjet_tst_128x256", 50.0),
             ("cudnn_generated_fort_native_sdpa", 80.0),
             ("loop_transpose_fusion_2", 20.0), ("loop_multiply_fusion_5", 40.0),
             ("some_custom_kernel", 5.0)]
  events = meta + [{"ph": "X", "pid": 7, "tid": 3, "ts": i, "dur": d, "name": n}
                   for i, (n, d) in enumerate(kernels)]
  # The derived "XLA Ops" line and host events are not counted.
  events += [{"ph": "X", "pid": 7, "tid": 9, "ts": 0, "dur": 999.0, "name": "fusion.1"},
             {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 999.0, "name": "gemm",
              "args": {"hlo_op": "dot"}}]
  _write_trace(tmp_path / "x.trace.json.gz", events)
  s = profile_summary.summarize(str(tmp_path))
  cats = {k: v["ms"] for k, v in s["categories"].items()}
  assert cats == pytest.approx({"fused dW + update": 0.4, "matmul": 0.3,
                                "attention": 0.08, "copy / transpose": 0.02,
                                "XLA fusion": 0.04, "other": 0.005})
  assert s["total_ms"] == pytest.approx(0.845)
  # The kernels start 1 us apart and overlap: no idle time, 0.3 ms span (the first is the longest).
  assert s["idle"]["idle_ms"] == pytest.approx(0.0)
  assert s["idle"]["span_ms"] == pytest.approx(0.3)
  assert s["categories"]["fused dW + update"]["count"] == 2
  assert s["top"][0] == dict(name="forge_fused_dw_adamw_mosaic",
                             category="fused dW + update", ms=pytest.approx(0.4),
                             count=2)


def test_idle_time_is_charged_to_the_kernels_around_each_gap():
  # Times in microseconds: a [0, 10), b [10, 30) overlapping c [20, 40), gap 40-100,
  # d [100, 110), gap 110-130, a [130, 135): span 135, busy 55, idle 80.
  ev = [dict(ts=t, dur=d, name=n) for t, d, n in
        [(100, 10, "d"), (0, 10, "a"), (20, 20, "c"), (10, 20, "b"), (130, 5, "a")]]
  idle = profile_summary.idle_time(ev)
  assert idle["span_ms"] == pytest.approx(0.135)
  assert idle["busy_ms"] == pytest.approx(0.055)
  assert idle["idle_ms"] == pytest.approx(0.080)
  assert idle["after"] == [dict(name="d", ms=pytest.approx(0.06), count=1),
                           dict(name="a", ms=pytest.approx(0.02), count=1)]
  assert idle["before"] == [dict(name="c", ms=pytest.approx(0.06), count=1),
                            dict(name="d", ms=pytest.approx(0.02), count=1)]
  assert profile_summary.idle_time([])["idle_ms"] == 0


def test_idle_table_keeps_every_row_when_the_columns_differ(capsys):
  # Three gaps after one long kernel L: three kernels after a gap, one before.
  ev = [dict(ts=t, dur=d, name=n) for t, d, n in
        [(0, 10, "L"), (20, 1, "a"), (21, 9, "L"), (40, 1, "b"), (41, 9, "L"),
         (60, 1, "c")]]
  idle = profile_summary.idle_time(ev)
  assert [k["name"] for k in idle["after"]] == ["a", "b", "c"]
  assert idle["before"] == [dict(name="L", ms=pytest.approx(0.03), count=3)]
  profile_summary.print_summary(dict(total_ms=0.04, categories={}, top=[], idle=idle))
  rows = [r for r in capsys.readouterr().out.splitlines()
          if r.startswith("| a ") or r.startswith("| b ") or r.startswith("| c ")]
  assert len(rows) == 3 and rows[0].endswith("| L | 0.030 | 3 |"), rows
  assert rows[2].endswith("|  |  |  |"), rows


def test_missing_trace_is_reported(tmp_path):
  with pytest.raises(FileNotFoundError, match="expected the directory given to jax.profiler.trace"):
    profile_summary.summarize(str(tmp_path))


def test_memory_llama_profiles_a_step_on_the_cpu(capsys):
  # On the CPU the summary counts the XLA ops the runtime ran.
  row = memory_llama.run_one("cpu-tiny", 16, "forge-bf16", "unrolled", steps=2,
                             profile=True, layers=1)  # one block: the same path
  prof = row["profile"]
  assert prof["total_ms"] > 0 and prof["top"]
  # The profiled step is the compiled one too: one lowering (stop 42).
  assert row["step_lowerings"] == 1
  assert all(k["ms"] > 0 for k in prof["top"])
  capsys.readouterr()
  memory_llama.print_profiles([row])
  out = capsys.readouterr().out
  # Headed by the row's whole layout label (its options among them).
  assert (f"forge-bf16 {memory_llama._layout_label(row)} T=16: step" in out
          and "| category | ms |" in out)
  assert memory_llama._layout_label(row).startswith("unrolled, ")


def test_without_stream_names_the_derived_lines_are_left_out(tmp_path):
  events = [
      {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "pid": 7, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
      {"ph": "X", "pid": 7, "tid": 2, "ts": 0, "dur": 10.0, "name": "wrapped_slice"},
      {"ph": "X", "pid": 7, "tid": 2, "ts": 1, "dur": 20.0, "name": "wrapped_convert"},
      {"ph": "X", "pid": 7, "tid": 2, "ts": 2, "dur": 30.0, "name": "splitKreduce_kernel"},
      {"ph": "X", "pid": 7, "tid": 9, "ts": 0, "dur": 999.0, "name": "fusion.1"},
  ]
  _write_trace(tmp_path / "x.trace.json.gz", events)
  cats = {k: v["ms"] for k, v in
          profile_summary.summarize(str(tmp_path))["categories"].items()}
  assert cats == pytest.approx({"copy / transpose": 0.01, "XLA fusion": 0.02,
                                "matmul": 0.03})


def test_host_control_flow_is_not_counted_beside_its_ops(tmp_path):
  # On the CPU a while op's event spans the ops of its body: only they count.
  events = [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 50.0, "name": "while.5",
       "args": {"hlo_op": "while.5"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 1, "dur": 30.0, "name": "dot.1",
       "args": {"hlo_op": "dot.1"}},
      {"ph": "X", "pid": 1, "tid": 2, "ts": 2, "dur": 20.0, "name": "add_fusion",
       "args": {"hlo_op": "add_fusion"}},
      {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 99.0, "name": "PjitFunction"},
  ]
  _write_trace(tmp_path / "x.trace.json.gz", events)
  s = profile_summary.summarize(str(tmp_path))
  assert s["total_ms"] == pytest.approx(0.05)
  assert {k: v["ms"] for k, v in s["categories"].items()} == pytest.approx(
      {"matmul": 0.03, "XLA fusion": 0.02})


def test_host_time_measures_host_work_around_the_device_span():
  meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
          {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:0"}}]
  host = [{"ph": "X", "pid": 1, "tid": 1, "ts": 100.0, "dur": 5000.0, "name": "Execute"},
          {"ph": "X", "pid": 1, "tid": 1, "ts": 200.0, "dur": 1500.0, "name": "Update"},
          {"ph": "X", "pid": 1, "tid": 1, "ts": 2000.0, "dur": 500.0, "name": "Update"},
          {"ph": "i", "pid": 1, "tid": 1, "ts": 0.0, "name": "marker"},  # no duration
          # The Python tracer's events (the profiler's own stop among them).
          {"ph": "X", "pid": 1, "tid": 1, "ts": 50.0, "dur": 9e5,
           "name": "$profiler.py:271 stop_trace"}]
  dev = [{"ph": "X", "pid": 7, "tid": 3, "ts": 1800.0, "dur": 1000.0, "name": "k1"},
         {"ph": "X", "pid": 7, "tid": 3, "ts": 3000.0, "dur": 1100.0, "name": "k2"}]
  h = profile_summary.host_time(meta + host + dev, dev, top=5)
  assert h["span_ms"] == pytest.approx(5.0)     # 100 .. 5100 us
  assert h["lead_ms"] == pytest.approx(1.7)     # host 100 -> device 1800
  assert [(k["name"], k["count"]) for k in h["top"]] == [("Execute", 1), ("Update", 2)]
  assert h["top"][1]["ms"] == pytest.approx(2.0)
  assert profile_summary.host_time(meta + dev, dev) == {}


def test_hlo_summary_counts_kernels_inside_and_outside_command_buffers():
  text = """HloModule jit_step

%command_buffer (p0: f32[8], p1: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %f = f32[8]{0} fusion(f32[8]{0} %p0), kind=kLoop, calls=%fused_add
  %g = f32[8]{0} custom-call(f32[8]{0} %f), custom_call_target="__cublas$gemm"
  ROOT %h = f32[8]{0} fusion(f32[8]{0} %g), kind=kLoop, calls=%fused_mul
}

%command_buffer.1 (p0: f32[8]) -> f32[8] {
  ROOT %f2 = f32[8]{0} fusion(f32[8]{0} %p0), kind=kLoop, calls=%fused_add
}

ENTRY %main.5 (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %c = f32[8]{0} call(f32[8]{0} %a, f32[8]{0} %a), to_apply=%command_buffer
  %m = f32[8]{0} custom-call(f32[8]{0} %c), custom_call_target="mosaic_gpu_v2"
  %m2 = f32[8]{0} custom-call(f32[8]{0} %m), custom_call_target="mosaic_gpu_v2"
  %c2 = f32[8]{0} call(f32[8]{0} %m2), to_apply=%command_buffer.1
  ROOT %x = f32[8]{0} fusion(f32[8]{0} %c2), kind=kLoop, calls=%fused_neg
}
"""
  h = profile_summary.hlo_summary(text)
  assert h["command_buffers"] == 2
  assert h["fusions"] == [3, 1]
  assert h["custom_calls"] == {"__cublas$gemm": [1, 0], "mosaic_gpu_v2": [0, 2]}


def test_hlo_summary_counts_each_launched_kernel_once_where_it_runs():
  """A fusion's own computations (its body, fusions nested in it) are not
  kernels of their own; a loop body run by a command buffer is inside it;
  async starts count like the op (found by the breaker, stop 31)."""
  text = """HloModule jit_step

%nested_gemm (p0: bf16[8,8]) -> bf16[8,8] {
  %p0 = bf16[8,8]{1,0} parameter(0)
  ROOT %n = bf16[8,8]{1,0} fusion(bf16[8,8]{1,0} %p0), kind=kCustom, calls=%inner
}

%gemm_fusion_dot (p0: bf16[8,8]) -> bf16[8,8] {
  %p0 = bf16[8,8]{1,0} parameter(0)
  %a = bf16[8,8]{1,0} fusion(bf16[8,8]{1,0} %p0), kind=kCustom, calls=%nested_gemm
  ROOT %b = bf16[8,8]{1,0} fusion(bf16[8,8]{1,0} %a), kind=kCustom, calls=%nested_gemm
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %f = f32[8]{0} fusion((s32[], f32[8]{0}) %p), kind=kLoop, calls=%fused_add
  ROOT %t = (s32[], f32[8]{0}) tuple(s32[] %i, f32[8]{0} %f)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0}) parameter(0)
  ROOT %lt = pred[] fusion((s32[], f32[8]{0}) %p), kind=kLoop, calls=%fused_lt
}

%command_buffer (p0: bf16[8,8], p1: (s32[], f32[8])) -> bf16[8,8] {
  %p0 = bf16[8,8]{1,0} parameter(0)
  %g = bf16[8,8]{1,0} fusion(bf16[8,8]{1,0} %p0), kind=kCustom, calls=%gemm_fusion_dot
  %w = (s32[], f32[8]{0}) while((s32[], f32[8]{0}) %p1), condition=%cond, body=%body
  ROOT %r = bf16[8,8]{1,0} copy(bf16[8,8]{1,0} %g)
}

ENTRY %main.5 (a: bf16[8,8], b: (s32[], f32[8])) -> bf16[8,8] {
  %a = bf16[8,8]{1,0} parameter(0)
  %b = (s32[], f32[8]{0}) parameter(1)
  %c = bf16[8,8]{1,0} call(bf16[8,8]{1,0} %a, (s32[], f32[8]{0}) %b), to_apply=%command_buffer
  %s = ((bf16[8,8]{1,0}), bf16[8,8]{1,0}, u32[]) custom-call-start(bf16[8,8]{1,0} %c), custom_call_target="foo"
  %fs = ((bf16[8,8]{1,0}), bf16[8,8]{1,0}) fusion-start(bf16[8,8]{1,0} %c), kind=kLoop, calls=%fused_neg
  ROOT %x = bf16[8,8]{1,0} fusion(bf16[8,8]{1,0} %c), kind=kLoop, calls=%fused_neg
}
"""
  h = profile_summary.hlo_summary(text)
  assert h["command_buffers"] == 1
  # inside: the gemm fusion (its three nested fusions not counted), the
  # loop body's and condition's fusions; outside: fusion-start and fusion.
  assert h["fusions"] == [3, 2]
  assert h["custom_calls"] == {"foo": [0, 1]}


def test_host_time_leaves_out_the_device_events_and_untimed_ones():
  """Off the GPU the device events are the host's XLA ops: not host work."""
  ops = [{"ph": "X", "pid": 1, "tid": 2, "ts": 10.0, "dur": 50.0, "name": "fusion.1",
          "args": {"hlo_op": "fusion.1"}}]
  runtime = [{"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0, "name": "Execute"},
             {"ph": "X", "pid": 1, "tid": 1, "ts": 5.0, "dur": None, "name": "bad"},
             {"ph": "X", "pid": 1, "tid": 1, "ts": "x", "dur": 1.0, "name": "bad"}]
  events = ops + runtime
  device = profile_summary.device_events(events)
  assert [e["name"] for e in device] == ["fusion.1"]
  h = profile_summary.host_time(events, device)
  assert [k["name"] for k in h["top"]] == ["Execute"]
  assert h["lead_ms"] == pytest.approx(0.01)


def test_hlo_summary_follows_every_branch_of_a_conditional():
  """``branch_computations={%a, %b}``: the second name, after a space, is a
  computation too (it kept its '%' and was missed before stop 31's read)."""
  text = """HloModule m

%a (p: f32[8]) -> f32[8] {
  ROOT %f = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fa
}

%b (p: f32[8]) -> f32[8] {
  ROOT %g = f32[8]{0} fusion(f32[8]{0} %p), kind=kLoop, calls=%fb
}

%command_buffer (i: s32[], p: f32[8]) -> f32[8] {
  ROOT %c = f32[8]{0} conditional(s32[] %i, f32[8]{0} %p, f32[8]{0} %p), branch_computations={%a, %b}
}

ENTRY %main (i: s32[], p: f32[8]) -> f32[8] {
  ROOT %r = f32[8]{0} call(s32[] %i, f32[8]{0} %p), to_apply=%command_buffer
}
"""
  assert profile_summary.hlo_summary(text)["fusions"] == [2, 0]
