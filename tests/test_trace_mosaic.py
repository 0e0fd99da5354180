"""experiments/trace_mosaic's trace reading and kernel_mosaic.profiled's checks
(the profiler itself needs a GPU; its runs are in docs/results.md)."""

import pytest

from experiments import trace_mosaic
from pallas_kernels.fused_dw import kernel_mosaic


def _events(pid, tid, spans):
  out = []
  for name, b, e in spans:
    out += [dict(name=name, ph="B", ts=b, pid=pid, tid=tid),
            dict(name=name, ph="E", ts=e, pid=pid, tid=tid)]
  return out


def test_summarize_ping_pong_by_hand():
  # One CTA of three warpgroups (tids 1-3; 3 is the memory warpgroup, ignored).
  trace = {"traceEvents":
           _events(1, 1, [("token_loop", 0, 10), ("epilogue", 10, 16),
                          ("token_loop", 20, 30), ("epilogue", 30, 36)])
           + _events(1, 2, [("token_loop", 0, 20), ("epilogue", 20, 26),
                            ("token_loop", 26, 40), ("epilogue", 40, 46)])
           + _events(1, 3, [("token_loop", 0, 99)])}
  s = trace_mosaic.summarize(trace, traces_per_block=3, compute_wgs=2)
  assert s["ctas"] == 1
  assert s["period"] == pytest.approx(46 / 4)
  assert s["token_loop"] == pytest.approx((10 + 10 + 20 + 14) / 4)
  assert s["epilogue"] == pytest.approx(6)
  # Epilogue time under the other warpgroup's token loop: 6 + 6 + 6 + 0 of 24.
  assert s["overlap"] == pytest.approx(18 / 24)
  # wg1's token loop while wg0 is in neither region: [16, 20] and [36, 40].
  assert s["tl_alone"] == pytest.approx(8 / 46)


def test_summarize_one_warpgroup_ctas_average():
  trace = {"traceEvents":
           _events(1, 1, [("token_loop", 0, 8), ("epilogue", 8, 10)])
           + _events(1, 2, [("token_loop", 0, 4), ("epilogue", 4, 8)])}
  s = trace_mosaic.summarize(trace, traces_per_block=1, compute_wgs=1)
  assert s["ctas"] == 2
  assert s["period"] == pytest.approx((10 + 8) / 2)
  assert s["token_loop"] == pytest.approx(6)
  assert s["epilogue"] == pytest.approx(3)
  assert s["overlap"] == 0 and s["tl_alone"] == 0


def test_per_sm_by_hand():
  # Multiprocessor 0 (pid 1): two CTAs out of step; clock 2 GHz, so each
  # CTA's cycles after its first event count half on the common axis. CTA A
  # starts at 0 with Mosaic's own Init region, as on the GPU: token loop
  # [0.1, 4] µs, epilogue [4, 8]. CTA B starts at 4 (ts0 = 4): token loop
  # [4, 8], epilogue [8, 12].
  a = _events(1, 1, [("Init", 0, 0.2), ("token_loop", 0.2, 8), ("epilogue", 8, 16)])
  b = _events(1, 2, [("token_loop", 4, 12), ("epilogue", 12, 20)])
  # Multiprocessor 1 (pid 2): two CTAs in step (token loops [0, 2] µs,
  # epilogues [2, 4]), then D's second token loop [6, 8] after a gap.
  c = _events(2, 3, [("token_loop", 0, 4), ("epilogue", 4, 8)])
  d = _events(2, 4, [("token_loop", 0, 4), ("epilogue", 4, 8),
                     ("token_loop", 12, 16)])
  s = trace_mosaic.per_sm({"traceEvents": a + b + c + d}, clock_ghz=2.0)
  assert s["sms"] == 2
  # SM 0: A's epilogue [4, 8] under B's token loop [4, 8]; B's under none.
  # SM 1: no epilogue under another's token loop.
  assert s["sm_epi_under_tl"] == pytest.approx((4 / 8 + 0) / 2)
  # SM 0: no token loop under another's; SM 1: [0, 2] twice of 2 + 4 µs.
  assert s["sm_tl_under_tl"] == pytest.approx((0 + 4 / 6) / 2)
  # SM 0's span [0.1, 12] µs is never idle; SM 1's [0, 8] is idle in [4, 6].
  assert s["sm_idle"] == pytest.approx((0 + 2 / 8) / 2)
  # SM 0: A's regions start at 0.2 / 2 = 0.1 µs (after Init); span [0.1, 12].
  assert s["sm_resident"] == pytest.approx((15.9 / 11.9 + 10 / 8) / 2)
  for bad in (0, -1.0, float("inf"), float("nan")):
    with pytest.raises(ValueError, match="clock_ghz"):
      trace_mosaic.per_sm({"traceEvents": a}, clock_ghz=bad)
  with pytest.raises(ValueError, match="no token_loop"):
    trace_mosaic.per_sm({"traceEvents": _events(1, 1, [("epilogue", 0, 1)])},
                        clock_ghz=2.0)


def test_intervals_skip_metadata_and_open_regions():
  trace = {"traceEvents": [dict(name="process_name", ph="M", pid=1)]
           + _events(1, 1, [("token_loop", 0, 4)])
           + [dict(name="epilogue", ph="B", ts=4, pid=1, tid=1)]}
  assert trace_mosaic.intervals(trace) == {(1, 1): [("token_loop", 0, 4)]}


def test_trace_errors():
  with pytest.raises(ValueError, match="without its begin"):
    trace_mosaic.intervals({"traceEvents": [
        dict(name="epilogue", ph="E", ts=1, pid=1, tid=1)]})
  with pytest.raises(ValueError, match="no token_loop"):
    trace_mosaic.summarize({"traceEvents": _events(1, 1, [("epilogue", 0, 1)])},
                           1, 1)


def test_profiled_checks_and_restores():
  with pytest.raises(ValueError, match="profile_space"):
    with kernel_mosaic.profiled("/tmp/x", 0):
      pass
  with pytest.raises(ValueError, match="profile_dir"):
    with kernel_mosaic.profiled("", 8):
      pass
  with pytest.raises(ValueError, match="profile_space"):
    with kernel_mosaic.profiled("/tmp/x", True):
      pass
  assert kernel_mosaic._PROFILE == {}
  with kernel_mosaic.profiled("/tmp/x", 8):
    assert kernel_mosaic._PROFILE["profile_space"] == 8
    assert kernel_mosaic._PROFILE["profile_dir"] == "/tmp/x"
  assert kernel_mosaic._PROFILE == {}


def test_cli_refuses_bad_arguments():
  for argv in (["--configs", "nope"], ["--rules", "lion"], ["--modes", "fp8"],
               ["--space", "0"], ["--scalars-at", "warp"], ["--reps", "0"],
               ["--clock-mhz", "0"], ["--clock-mhz", "inf"],
               ["--shapes", "bogus"], ["--shapes", "2048:4096x0"]):
    with pytest.raises(SystemExit):
      trace_mosaic.main(argv)


def test_regions_reason():
  C = trace_mosaic.CONFIGS
  # Ping-pong at 4096x14336 on 132 multiprocessors: 3584 tiles, 14 per
  # warpgroup, 29 ranges.
  assert trace_mosaic.regions_reason(C["PP_n128s4e64"], 4096, 14336, 40) == ""
  assert "below the 29" in trace_mosaic.regions_reason(
      C["PP_n128s4e64"], 4096, 14336, 28)
  assert trace_mosaic.regions_reason(C["m128n128t64s3"], 64, 64, 3) == ""
  assert "marks no" in trace_mosaic.regions_reason(C["WS_A_n128s2e32"], 4096, 4096, 99)
  assert "marks no" in trace_mosaic.regions_reason(C["m128n128t64s3E"], 4096, 4096, 99)


def test_scalars_at_is_checked(monkeypatch):
  monkeypatch.setattr(kernel_mosaic, "SCALARS_AT", "Tile")
  with pytest.raises(ValueError, match="SCALARS_AT='Tile'"):
    kernel_mosaic._read_scalars([1.0], "tile")
