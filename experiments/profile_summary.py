"""Where a step's device time goes: JAX profiler trace, summed by kind of kernel.

``jax.profiler.trace(dir)`` writes a trace-viewer JSON (``*.trace.json.gz``)
beside its XSpace (jax 0.10 and 0.11). This reads that JSON (no TensorBoard
needed) and sums the durations of the device's events: on a GPU the kernels
on the streams of the ``/device:GPU:N`` processes, elsewhere the XLA ops the
host's runtime threads ran (events that carry an ``hlo_op``; loops and
conditionals left out, as the ops inside them are counted; there a matmul
can sit inside a CPU fusion, so the categories are rough). Each kernel is
put in a category by its name, the first that matches:

* ``fused dW + update``: the Pallas kernels of ``pallas_kernels.fused_dw``
  (``forge_fused_dw_<rule>[_mosaic]``);
* ``attention``: cuDNN fused attention (``cudnn``, ``fmha``, ``flash``);
* ``matmul``: cuBLAS / cuBLASLt / CUTLASS GEMMs and their helpers
  (``gemm``, ``gemv``, ``splitK``, ``nvjet``, ``xmma``, ``cutlass``,
  ``cublas``, ``dot``);
* ``copy / transpose``: ``copy``, ``transpose``, ``slice`` (XLA's
  ``wrapped_slice``, ``wrapped_dynamic_update_slice``), memcpy and memset;
* ``XLA fusion``: XLA's own generated kernels (``fusion``, ``wrapped_``,
  ``loop_``, ``input_``), the elementwise updates of an unfused optimizer
  among them;
* ``other``.

Times are sums of kernel durations: kernels that overlapped on two streams
count twice, and time between kernels is not in them (compare the total
with the step's wall time).

    python -m experiments.profile_summary /tmp/trace_dir [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import itertools
import json
import os
import re

CATEGORIES = (
    ("fused dW + update", re.compile(r"forge_fused_dw")),
    ("attention", re.compile(r"cudnn|fmha|flash", re.I)),
    ("matmul", re.compile(r"gemm|gemv|splitk|nvjet|xmma|cutlass|cublas|dot",
                          re.I)),
    ("copy / transpose", re.compile(r"copy|transpose|slice|memcpy|memset",
                                    re.I)),
    ("XLA fusion", re.compile(r"fusion|wrapped_|^loop_|^input_", re.I)),
)


CONTROL_FLOW = re.compile(r"(while|conditional|call)(\.|$)")
"""Host (CPU) ops whose time is that of the ops they run, counted apart."""


def category(name: str) -> str:
  """The category of a kernel (or XLA op) name; see the module doc."""
  for cat, pattern in CATEGORIES:
    if pattern.search(name):
      return cat
  return "other"


def find_trace(path: str) -> str:
  """The newest ``*.trace.json.gz`` under ``path`` (or ``path`` itself).

  Raises:
    FileNotFoundError: if there is none.
  """
  if os.path.isfile(path):
    return path
  found = glob.glob(os.path.join(path, "**", "*.trace.json.gz"), recursive=True)
  if not found:
    raise FileNotFoundError(
        f"no *.trace.json.gz under {path!r}: expected the directory given "
        "to jax.profiler.trace (or the file itself)")
  return max(found, key=os.path.getmtime)


def _gpu_pids(events: list) -> set:
  """The pids of the trace's ``/device:GPU`` processes."""
  return {e["pid"] for e in events if e.get("ph") == "M"
          and e.get("name") == "process_name"
          and str(e.get("args", {}).get("name", "")).startswith("/device:GPU")}


def _ranked(table: dict, top: int) -> list:
  """``{name: [ms, count]}`` as ``[{"name", "ms", "count"}]``, the ``top``
  names by time."""
  return [dict(name=k, ms=v[0], count=v[1]) for k, v in
          sorted(table.items(), key=lambda kv: -kv[1][0])[:top]]


def device_events(events: list) -> list:
  """The device's complete events: the kernels on the streams of the
  ``/device:GPU`` processes when the trace has any (not the "XLA Ops" /
  "XLA Modules" / "Steps" lines derived from them, which would count them
  twice; without thread names, every line but those), else the host events
  that ran an XLA op."""
  meta = [e for e in events if e.get("ph") == "M"]
  gpu = _gpu_pids(meta)
  done = [e for e in events if e.get("ph") == "X" and "dur" in e]
  if not gpu:  # the host's XLA ops, less the control flow that encloses others
    return [e for e in done if "hlo_op" in e.get("args", {})
            and not CONTROL_FLOW.match(str(e.get("name", "")))]
  names = {(e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
           for e in meta if e.get("pid") in gpu and e.get("name") == "thread_name"}
  streams = {k for k, v in names.items() if v.startswith("Stream")}
  if streams:
    return [e for e in done if (e.get("pid"), e.get("tid")) in streams]
  derived = {k for k, v in names.items() if v.startswith(("XLA ", "Steps"))}
  return [e for e in done if e.get("pid") in gpu
          and (e["pid"], e.get("tid")) not in derived]


def idle_time(events: list, top: int = 8) -> dict:
  """When the device waited: the events merged onto one timeline.

  ``span_ms`` runs from the first start to the last end, ``busy_ms`` is the
  union of the events' intervals (overlaps counted once) and ``idle_ms`` the
  rest: time with no kernel running, e.g. waiting for the host to launch the
  next one. Each gap is charged to the event that ended it (``after``: the
  kernel the device waited for) and the one before it (``before``), summed
  by name; the ``top`` names by gap time, each ``{"name", "ms", "count"}``.
  """
  timed = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                  str(e.get("name", ""))) for e in events if "ts" in e and "dur" in e)
  after = collections.defaultdict(lambda: [0.0, 0])
  before = collections.defaultdict(lambda: [0.0, 0])
  busy, end, last = 0.0, None, ""
  for start, stop, name in timed:
    if end is None or start >= end:
      if end is not None and start > end:
        for table, key in ((after, name), (before, last)):
          table[key][0] += (start - end) / 1e3
          table[key][1] += 1
      busy += stop - start
      end, last = stop, name
    elif stop > end:
      busy += stop - end
      end, last = stop, name
  span = (end - timed[0][0]) if timed else 0.0
  return dict(span_ms=span / 1e3, busy_ms=busy / 1e3,
              idle_ms=(span - busy) / 1e3, after=_ranked(after, top),
              before=_ranked(before, top))


def host_time(events: list, device: list, top: int = 12) -> dict:
  """What the host did during the traced step, beside the device's span.

  The host's complete events (every process but the ``/device:GPU`` ones;
  not the events in ``device``, which off the GPU are the host's XLA ops;
  not the Python tracer's ``$file:line function`` events, which include
  the profiler's own start and stop; not events without a time and
  duration) summed by name: inclusive times, so an event and the ones nested in it
  each count (``top`` names by time, ``{"name", "ms", "count"}``).
  ``span_ms`` runs from the first host event's start to the last one's
  end; ``lead_ms`` from that start to the device's first kernel: host
  work before the device starts, such as argument handling and, on the
  GPU, updating the step's CUDA graph (``command_buffer::update``) before
  launching it. The trace gives host and device events one clock. (The
  host's wait for the result is a Python event, left out, so the host's
  events end long before the device's.) Empty (``{}``) without host or
  device events.
  """
  gpu = _gpu_pids(events)
  on_device = {id(e) for e in device}  # off the GPU: the host's XLA ops

  def timed(e):
    try:
      return float(e["ts"]) >= 0 and float(e["dur"]) >= 0
    except (KeyError, TypeError, ValueError):
      return False
  host = [e for e in events if e.get("ph") == "X" and timed(e)
          and e.get("pid") not in gpu and id(e) not in on_device
          and not str(e.get("name", "")).startswith("$")]
  dev = [e for e in device if timed(e)]
  if not host or not dev:
    return {}
  by_name = collections.defaultdict(lambda: [0.0, 0])
  for e in host:
    entry = by_name[str(e.get("name", ""))]
    entry[0] += float(e["dur"]) / 1e3
    entry[1] += 1
  h0 = min(float(e["ts"]) for e in host)
  h1 = max(float(e["ts"]) + float(e["dur"]) for e in host)
  d0 = min(float(e["ts"]) for e in dev)
  return dict(span_ms=(h1 - h0) / 1e3, lead_ms=(d0 - h0) / 1e3,
              top=_ranked(by_name, top))


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_CUSTOM_CALL = re.compile(r"\scustom-call(?:-start)?\(")
_FUSION = re.compile(r"\sfusion(?:-start)?\(")
# Computations an instruction runs: calls=, to_apply=, body=, condition=,
# branch_computations={...}.
_CALLED = re.compile(r"(calls|to_apply|body|condition|branch_computations)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")


def _closure(roots, edges) -> set:
  seen, todo = set(), list(roots)
  while todo:
    c = todo.pop()
    if c not in seen:
      seen.add(c)
      todo.extend(edges.get(c, ()))
  return seen


def hlo_summary(text: str) -> dict:
  """Where a compiled step's kernels sit relative to XLA's command buffers
  (CUDA graphs), from its optimized HLO (``compiled.as_text()``).

  XLA's HLO command-buffer pass outlines runs of capturable ops into
  computations named ``command_buffer*``, each launched as one graph; an op
  it cannot capture (a custom call whose handler is not marked
  command-buffer compatible) ends the run. The XLA of jax 0.11 on the H200
  shows none in the HLO and still runs the whole step as one CUDA graph
  (``command_buffer_1``, one ``cuGraphLaunch`` among the profile's host
  events, Mosaic kernels included): it forms them from the thunk sequence.
  So 0 here does not mean no graphs. Returns ``{"command_buffers":
  the call sites of such computations, "fusions": [inside, outside],
  "custom_calls": {target: [inside, outside]}}``. Inside means in a
  ``command_buffer*`` computation or one it runs (a loop's body, a
  branch). A fusion counts once: the computations a fusion calls (its
  body, and fusions nested in it) are not counted. Async starts
  (``fusion-start``, ``custom-call-start``) count like the op.
  """
  comps, order, current = {}, [], None
  for line in text.splitlines():
    if line and not line[0].isspace():
      m = _COMPUTATION.match(line)
      current = m.group(1) if m else None
      if current is not None:
        comps.setdefault(current, [])
        order.append(current)
      continue
    if current is not None:
      comps[current].append(line)

  def called(line):
    return [n.strip().lstrip("%") for _, v in _CALLED.findall(line)
            for n in v.strip("{}").split(",") if n.strip()]

  callees = {c: [called(line) for line in lines] for c, lines in comps.items()}
  edges = {c: [n for ns in cs for n in ns] for c, cs in callees.items()}
  bodies = _closure([n for c, lines in comps.items()
                     for line, ns in zip(lines, callees[c])
                     if _FUSION.search(line) for n in ns], edges)
  inside = _closure([c for c in comps if c.startswith("command_buffer")], edges)
  calls = 0
  fusions = [0, 0]
  custom = collections.defaultdict(lambda: [0, 0])
  for c in order:
    if c in bodies:
      continue
    k = 0 if c in inside else 1
    for line, ns in zip(comps[c], callees[c]):
      calls += sum(n.startswith("command_buffer") for n in ns)
      m = _TARGET.search(line)
      if m and _CUSTOM_CALL.search(line):
        custom[m.group(1)][k] += 1
      elif _FUSION.search(line):
        fusions[k] += 1
  return dict(command_buffers=calls, fusions=fusions,
              custom_calls={t: v for t, v in sorted(custom.items())})


def summarize(path: str, top: int = 15) -> dict:
  """Sums of device time in ms by category and by kernel.

  Returns:
    ``{"total_ms", "categories": {category: {"ms", "count"}}, "top":
    [{"name", "category", "ms", "count"}, ...], "idle": idle_time(...),
    "host": host_time(...)}`` (the ``top`` kernels by time; when the device
    waited; what the host did), from the trace
    at (or under) ``path``.
  """
  with gzip.open(find_trace(path), "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  by_cat = collections.defaultdict(lambda: [0.0, 0])
  by_name = collections.defaultdict(lambda: [0.0, 0])
  device = device_events(events)
  for e in device:
    name = str(e.get("name", ""))
    ms = float(e["dur"]) / 1e3  # trace durations are in microseconds
    for table, key in ((by_cat, category(name)), (by_name, name)):
      table[key][0] += ms
      table[key][1] += 1
  return dict(
      idle=idle_time(device, top),
      host=host_time(events, device, top),
      total_ms=sum(v[0] for v in by_cat.values()),
      categories={k: dict(ms=v[0], count=v[1])
                  for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1][0])},
      top=[dict(k, category=category(k["name"])) for k in _ranked(by_name, top)])


def _print_table(columns: list, rows) -> None:
  """A markdown table: ``columns`` names, each row a list of cell strings."""
  print("| " + " | ".join(columns) + " |")
  print("|" + "---|" * len(columns))
  for row in rows:
    print("| " + " | ".join(row) + " |")


def print_summary(summary: dict, title: str = "") -> None:
  print(f"\n{title}device time {summary['total_ms']:.2f} ms (sum of kernel durations)")
  _print_table(["category", "ms", "kernels"],
               ([c, f"{v['ms']:.2f}", str(v["count"])]
                for c, v in summary["categories"].items()))
  print()
  _print_table(["kernel", "category", "ms", "count"],
               ([k["name"][:90], k["category"], f"{k['ms']:.3f}", str(k["count"])]
                for k in summary["top"]))
  idle = summary.get("idle")
  if idle:
    print(f"\nfirst start to last end {idle['span_ms']:.2f} ms: busy "
          f"{idle['busy_ms']:.2f} ms, idle {idle['idle_ms']:.2f} ms (no kernel running)")
    cells = lambda ks: [[k["name"][:60], f"{k['ms']:.3f}", str(k["count"])]  # noqa: E731
                        for k in ks]
    _print_table(["idle before this kernel", "ms", "gaps",
                  "idle after this kernel", "ms", "gaps"],
                 (a + b for a, b in itertools.zip_longest(
                     cells(idle["after"]), cells(idle["before"]),
                     fillvalue=["", "", ""])))  # a blank row's cells
  host = summary.get("host")
  if host:
    print(f"\nhost: first start to last end {host['span_ms']:.2f} ms; the device's "
          f"first kernel {host['lead_ms']:.2f} ms after the host's first event")
    _print_table(["host event (inclusive)", "ms", "count"],
                 ([k["name"][:90], f"{k['ms']:.3f}", str(k["count"])]
                  for k in host["top"]))


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0], epilog="Categories: "
      + ", ".join(c for c, _ in CATEGORIES) + ", other (first match by name).")
  p.add_argument("trace", help="a jax.profiler.trace directory or a *.trace.json.gz")
  p.add_argument("--top", type=int, default=15,
                 help="kernels listed by time (default: %(default)s)")
  a = p.parse_args(argv)
  summary = summarize(a.trace, a.top)
  print_summary(summary)
  return summary


if __name__ == "__main__":
  main()
