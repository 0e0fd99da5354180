"""What is live at the peak of a compiled JAX step, read from XLA's own dump.

``memory_analysis()`` gives a step's argument and temp sizes, not what fills
the temp. XLA computes the live set at its memory peak when it assigns
buffers and writes it in its dump (``*-live-range.txt``, section "Live ranges
at N (peak)"); this reads that section, attaches each value's shape and the
JAX operation that made it (the ``op_name`` metadata of the optimized HLO),
and separates the step's parameters (weights, optimizer state, batch) from
everything else (activations, gradients, copies, workspaces).

Usage::

  XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=jit_step" \\
      python my_training_script.py
  python -m experiments.peak_report /tmp/dump [--module jit_step] [--top 40]

``python -m experiments.memory_llama --peak-report`` does both for each
variant it measures. The sizes are XLA's, per value; values that XLA places
in one buffer are listed once each, so the sum can exceed the buffer it
needs, and the allocation that ``memory_analysis()`` reports can exceed the
sum (fragmentation). Both are the compiled program's, on whatever backend
compiled it (the GPU's differs from the CPU's).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re

_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1,
          "f8e5m2": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16}


@dataclasses.dataclass(frozen=True)
class Value:
  """One value live at the peak."""

  name: str  # the HLO instruction
  index: str  # its tuple index, "" for a plain array
  bytes: int
  shape: str  # e.g. "bf16[2048,4096]" ("" when not found in the HLO)
  op_name: str  # the JAX op (metadata op_name), else the HLO opcode
  parameter: bool  # an argument of the entry computation
  buffer: str = "?"  # where XLA placed it: "argument" (an argument's buffer:
  # the argument itself, or a value written in place over a donated one),
  # "temp" (the temp allocation), "output", "constant", or "?" (not found)


@dataclasses.dataclass(frozen=True)
class PeakReport:
  """The live set at a compiled module's memory peak (bytes)."""

  module: str  # the dump's file name, without the suffix
  peak_index: int  # position in the schedule
  schedule_length: int
  schedule: tuple[str, ...]  # instruction names in schedule order
  values: tuple[Value, ...]  # largest first
  hlo_found: bool = True  # False: no optimized HLO beside the live ranges,
  # so no shapes, op names, or parameters told apart

  @property
  def parameter_bytes(self) -> int:
    """The step's own arguments, still live (not yet overwritten)."""
    return sum(v.bytes for v in self.values if v.parameter)

  @property
  def other_bytes(self) -> int:
    return sum(v.bytes for v in self.values if not v.parameter)

  def bytes_in(self, buffer: str) -> int:
    """Bytes of the values XLA placed in ``buffer`` ("argument", "temp", ...)."""
    return sum(v.bytes for v in self.values if v.buffer == buffer)

  def others(self) -> list[Value]:
    """The values that are neither arguments nor written over one: with the
    buffer assignment known, those outside argument buffers; else the
    non-parameters."""
    if any(v.buffer != "?" for v in self.values):
      return [v for v in self.values if v.buffer != "argument"]
    return [v for v in self.values if not v.parameter]

  def grouped(self) -> list[tuple[str, int, int]]:
    """(op name with layer indices as N, bytes, count) of :meth:`others`."""
    size, count = collections.Counter(), collections.Counter()
    for v in self.others():
      key = re.sub(r"layers_\d+", "layers_N", v.op_name)
      size[key] += v.bytes
      count[key] += 1
    return [(k, b, count[k]) for k, b in size.most_common()]


def find_dump(dump_dir: str, module: str = "jit_step") -> tuple[str, str]:
  """The live-range file of the last dumped module whose name holds ``module``.

  Returns:
    ``(live_range_path, optimized_hlo_path)``.

  Raises:
    FileNotFoundError: If ``dump_dir`` has no such file (the message says
      which XLA_FLAGS write it).
  """
  found = sorted(f for f in glob.glob(os.path.join(dump_dir, "*-live-range.txt"))
                 if module in os.path.basename(f))
  if not found:
    raise FileNotFoundError(
        f"no *-live-range.txt for a module named like {module!r} in "
        f"{dump_dir!r}; run the program with XLA_FLAGS=\"--xla_dump_to="
        f"{dump_dir} --xla_dump_hlo_module_re={module}\"")
  live = found[-1]
  return live, live[:-len("-live-range.txt")] + ".txt"


def _shape_bytes(shape: str) -> int:
  m = re.fullmatch(r"(\w+)\[([\d,]*)\]", shape)
  if not m or m.group(1) not in _BYTES:
    return 0
  n = 1
  for d in filter(None, m.group(2).split(",")):
    n *= int(d)
  return n * _BYTES[m.group(1)]


_DEF = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(")


def _hlo_info(hlo_path: str) -> dict[str, tuple[str, str, bool]]:
  """name -> (shape without layout, op_name or opcode, is an entry parameter)."""
  info, entry = {}, False
  if not os.path.exists(hlo_path):
    return info
  with open(hlo_path) as f:
    for line in f:
      if line.startswith("ENTRY"):
        entry = True
        continue
      if entry and line.startswith("}"):
        entry = False
      m = _DEF.match(line)
      if not m:
        continue
      name, shape, opcode = m.groups()
      shape = re.sub(r"\{[^{}]*\}", "", shape).strip()
      op = re.search(r'op_name="([^"]*)"', line)
      info[name] = (shape, op.group(1) if op else opcode,
                    entry and opcode == "parameter")
  return info


def _buffer_kinds(path: str) -> dict[tuple[str, str], str]:
  """(value name, tuple index) -> the kind of allocation XLA put it in."""
  kinds, kind = {}, None
  if not os.path.exists(path):
    return kinds
  with open(path) as f:
    for line in f:
      if line.startswith("allocation "):
        head = line.split("shape |")[0]
        kind = ("argument" if re.search(r", parameter \d+", head) else
                "temp" if "preallocated-temp" in head else
                "constant" if "constant" in head else
                "output" if "output shape" in line or "maybe-live-out" in head
                else "other")
        continue
      m = re.match(r"\s*value: <\d+ ([\w.\-]+)(?:\{([\d,]*)\})? @", line)
      if m and kind:
        kinds[(m.group(1), m.group(2) or "")] = kind
  return kinds


def summarize(dump_dir: str, module: str = "jit_step") -> PeakReport:
  """Reads the peak's live set of ``module`` from an XLA dump directory.

  Raises:
    FileNotFoundError: see :func:`find_dump`.
    ValueError: If the live-range file has no peak section (an XLA that
      does not write one).
  """
  live_path, hlo_path = find_dump(dump_dir, module)
  info = _hlo_info(hlo_path)
  kinds = _buffer_kinds(live_path[:-len("-live-range.txt")] +
                        "-buffer-assignment.txt")
  schedule, peak, raw, section = [], None, [], None
  with open(live_path) as f:
    for line in f:
      s = line.strip()
      if s.startswith("InstructionSequence"):
        section = "seq"
        continue
      m = re.match(r"Live ranges at (\d+) \(peak\)", s)
      if m:
        section, peak = "peak", int(m.group(1))
        continue
      if s.startswith(("BufferLiveRange", "Stack trace")):
        section = None
        continue
      if section == "seq":
        m = re.match(r"\d+:(\S+)", s)
        if m:
          schedule.append(m.group(1))
      elif section == "peak":
        m = re.match(r"([\w.\-]+)\{([\d,]*)\}: (\d+) bytes", s)
        if m:
          raw.append((m.group(1), m.group(2), int(m.group(3))))
  if peak is None:
    raise ValueError(f"{live_path!r} has no 'Live ranges at N (peak)' section")
  values = []
  for name, index, nbytes in raw:
    shape, op, is_param = info.get(name, ("", "", False))
    if index and shape.startswith("("):  # one element of a tuple
      parts = re.findall(r"\w+\[[\d,]*\]", shape)
      i = int(index.split(",")[0])
      shape = parts[i] if i < len(parts) else ""
    op = re.sub(r"^jit\(\w+\)/", "", op)
    values.append(Value(name, index, nbytes, shape, op, is_param,
                        kinds.get((name, index), "?")))
  values.sort(key=lambda v: (-v.bytes, v.name))
  module_name = os.path.basename(live_path)[:-len("-live-range.txt")]
  return PeakReport(module_name, peak, len(schedule), tuple(schedule),
                    tuple(values), hlo_found=bool(info))


def format_report(report: PeakReport, top: int = 40) -> str:
  """The report as text: totals, the schedule around the peak, the largest
  non-parameter values and the same grouped by operation."""
  gib = 2 ** 30
  lines = [
      f"{report.module}: peak at instruction {report.peak_index} of "
      f"{report.schedule_length}",
      f"live at the peak: {(report.parameter_bytes + report.other_bytes) / gib:.3f}"
      f" GiB = the step's arguments {report.parameter_bytes / gib:.3f} + other "
      f"values {report.other_bytes / gib:.3f}",
      "by buffer: " + ", ".join(
          f"{k} {report.bytes_in(k) / gib:.3f}"
          for k in ("argument", "temp", "output", "constant", "other", "?")
          if report.bytes_in(k)) + " GiB (argument: the arguments and the "
      "values written in place over them)",
      "schedule around the peak:"]
  if not report.hlo_found:
    lines.insert(2, "(no optimized HLO beside the live ranges: parameters are "
                 "counted as other, shapes and ops are unknown)")
  lo = max(0, report.peak_index - 4)
  for i, name in enumerate(report.schedule[lo:report.peak_index + 3], lo):
    lines.append(f"  {'>' if i == report.peak_index else ' '} {i:6d} {name}")
  others = report.others()
  lines.append(f"largest values outside argument buffers ({len(others)} in all):")
  for v in others[:top]:
    idx = f"{{{v.index}}}" if v.index else ""
    lines.append(f"  {v.bytes / 2**20:10.2f} MiB  {v.buffer:8s} {v.shape:24s} "
                 f"{v.name}{idx}  {v.op_name[-120:]}")
  lines.append("the same by operation (layer index as N):")
  for op, nbytes, n in report.grouped()[:top]:
    lines.append(f"  {nbytes / 2**20:10.2f} MiB  {n:4d} × {op[-120:]}")
  return "\n".join(lines)


def main(argv=None) -> PeakReport:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("dump_dir", help="the --xla_dump_to directory")
  p.add_argument("--module", default="jit_step",
                 help="a substring of the module's name (default: %(default)s)")
  p.add_argument("--top", type=int, default=40, help="rows per list")
  a = p.parse_args(argv)
  report = summarize(a.dump_dir, a.module)
  print(format_report(report, a.top))
  return report


if __name__ == "__main__":
  main()
