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
variant it measures. The sizes are XLA's, per value. Values that share one
buffer (an in-place op's operand and result) are each listed, but counted
once in the totals (XLA's own "stack trace breakdown" in the same file counts
them twice). The peak is that of everything live, arguments included, so the
temp live there can be less than ``memory_analysis()``'s temp size: that
allocation is sized for the temporaries' own maximum, which can fall
elsewhere, plus fragmentation. Values written in place over donated arguments
sit in argument buffers. All of it is the compiled program's, on whatever
backend compiled it (the GPU's differs from the CPU's). A program read from JAX's persistent compilation cache is not
compiled, so XLA writes no dump for it: run with the cache off
(``JAX_ENABLE_COMPILATION_CACHE=false``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re


BUFFER_KINDS = ("argument", "temp", "output", "constant", "other", "?")
"""The kinds of allocation a value can sit in (:attr:`Value.buffer`)."""


@dataclasses.dataclass(frozen=True)
class Value:
  """One value live at the peak."""

  name: str  # the HLO instruction
  index: str  # its tuple index, "" for a plain array
  bytes: int
  shape: str  # e.g. "bf16[2048,4096]" ("" when not found in the HLO)
  op_name: str  # the JAX op (metadata op_name); for XLA's own instructions
  # "<opcode> -> <op_name of its first user>", or the opcode alone
  parameter: bool  # an argument of the entry computation
  buffer: str = "?"  # where XLA placed it: "argument" (an argument's buffer:
  # the argument itself, or a value written in place over a donated one),
  # "temp" (the temp allocation), "output", "constant", or "?" (not found)
  slot: tuple[int, int] | None = None  # (allocation, offset): values that
  # share one buffer (an in-place op's operand and result) share a slot


@dataclasses.dataclass(frozen=True)
class TempPeak:
  """The temp allocation's own maximum: where most of it is live at once.

  XLA sizes the temp allocation (``memory_analysis()``'s temp size) by packing
  the temporaries at offsets in it. ``allocation_bytes - live_bytes`` is room
  that no single moment uses: values placed apart whose lifetimes never meet
  (fragmentation, alignment).
  """

  allocation_bytes: int  # the temp allocation's size
  live_bytes: int  # the most bytes of it live at once, a shared slot once
  index: int  # position in the schedule of that maximum
  values: tuple[Value, ...]  # live there, largest first


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
  temp_peak: TempPeak | None = None  # None: no buffer assignment, or no
  # temp allocation

  @property
  def live_bytes(self) -> int:
    """All bytes live at the peak, a buffer shared by several values once."""
    return _distinct_bytes(self.values)

  @property
  def parameter_bytes(self) -> int:
    """The step's own arguments, still live (not yet overwritten)."""
    return _distinct_bytes([v for v in self.values if v.parameter])

  @property
  def other_bytes(self) -> int:
    """:attr:`live_bytes` less :attr:`parameter_bytes`."""
    return self.live_bytes - self.parameter_bytes

  def bytes_in(self, buffer: str) -> int:
    """Bytes live in ``buffer`` kinds ("argument", "temp", ...), each shared
    buffer once."""
    return _distinct_bytes([v for v in self.values if v.buffer == buffer])

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


def _distinct_bytes(values) -> int:
  """Sum of sizes, counting each (allocation, offset) slot once (its largest)."""
  slots, loose = {}, 0
  for v in values:
    if v.slot is None:
      loose += v.bytes
    else:
      slots[v.slot] = max(slots.get(v.slot, 0), v.bytes)
  return loose + sum(slots.values())


def _module_of(path: str) -> tuple[int, str]:
  """(number, name) of a dump file ``module_<number>.<name>.<...>``."""
  parts = os.path.basename(path).split(".")
  m = re.fullmatch(r"module_(\d+)", parts[0])
  return (int(m.group(1)) if m else -1), (parts[1] if len(parts) > 2 else "")


def dumped_modules(dump_dir: str) -> list[str]:
  """Names of the modules with live ranges in ``dump_dir``, sorted."""
  return sorted({_module_of(f)[1] for f in
                 glob.glob(os.path.join(dump_dir, "*-live-range.txt"))})


def find_dump(dump_dir: str, module: str = "jit_step") -> tuple[str, str]:
  """The live-range file of the last dumped module named ``module``.

  The last: the highest module number, i.e. the latest compile of a function
  of that name (e.g. ``jit_step`` for a function named ``step``).

  Returns:
    ``(live_range_path, optimized_hlo_path)``.

  Raises:
    FileNotFoundError: If ``dump_dir`` is not a directory, or has no such
      file (the message says which XLA_FLAGS write it).
  """
  if not os.path.isdir(dump_dir):
    raise FileNotFoundError(f"{dump_dir!r} is not a directory (the --xla_dump_to one)")
  found = sorted((f for f in glob.glob(os.path.join(dump_dir, "*-live-range.txt"))
                  if _module_of(f)[1] == module), key=_module_of)
  if not found:
    others = dumped_modules(dump_dir)
    raise FileNotFoundError(
        f"no *-live-range.txt for a module named {module!r} in {dump_dir!r} "
        f"(modules there: {others or 'none'}). A function f jitted is the "
        f"module jit_f; run the program with XLA_FLAGS=\"--xla_dump_to="
        f"{dump_dir} --xla_dump_hlo_module_re={module}\" and the persistent "
        "compilation cache off")
  live = found[-1]
  return live, live[:-len("-live-range.txt")] + ".txt"


_DEF = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(")


def _hlo_info(hlo_path: str) -> dict[str, tuple[str, str, bool]]:
  """name -> (shape without layout, op name, is an entry parameter).

  The op name is the instruction's JAX ``op_name`` metadata. XLA's own
  instructions (copies, wrapped fusions) have none: they get their opcode
  and, after an arrow, the op name of their first user that has one, e.g.
  ``copy -> .../q_proj/dot_general``.
  """
  info, entry, user_op = {}, False, {}
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
      info[name] = (shape, op.group(1) if op else None, opcode,
                    entry and opcode == "parameter")
      if op:
        for operand in re.findall(r"%([\w.\-]+)", line[m.end():]):
          user_op.setdefault(operand, op.group(1))
  out = {}
  for name, (shape, op, opcode, is_param) in info.items():
    if op is None:
      op = f"{opcode} -> {user_op[name]}" if name in user_op else opcode
    out[name] = (shape, op, is_param)
  return out


def _buffer_kinds(path: str):
  """Reads XLA's buffer assignment.

  Returns:
    ``(kinds, temp_allocations)``: (value name, tuple index) -> (kind of
    allocation, (allocation, offset), size in bytes); and allocation -> size
    for the temp allocations.
  """
  kinds, temps, kind, alloc = {}, {}, None, None
  if not os.path.exists(path):
    return kinds, temps
  with open(path) as f:
    for line in f:
      m = re.match(r"allocation (\d+): size (\d+)", line)
      if m:
        alloc, alloc_size = int(m.group(1)), int(m.group(2))
        head = line.split("shape |")[0]
        kind = ("argument" if re.search(r", parameter \d+", head) else
                "temp" if "preallocated-temp" in head else
                "constant" if "constant" in head else
                "output" if "output shape" in line or "maybe-live-out" in head
                else "other")
        if kind == "temp":
          temps[alloc] = alloc_size
        continue
      # e.g. "value: <106 while.5{1} (phi) @0> (size=524288,offset=0): ..."
      m = re.match(r"\s*value: <\d+ ([\w.\-]+)(?:\{([\d,]*)\})?[^@>]* @\d+>"
                   r"(?: \(size=(\d+),offset=(\d+)\))?", line)
      if m and kind:
        size = int(m.group(3)) if m.group(3) else alloc_size
        offset = int(m.group(4)) if m.group(4) else 0
        kinds[(m.group(1), m.group(2) or "")] = (kind, (alloc, offset), size)
  return kinds, temps


def _tuple_element(shape: str, index: str) -> str:
  """The array shape at tuple ``index`` ("1,0") of a (nested) tuple shape."""
  tokens = re.findall(r"\w+\[[\d,]*\]|\(|\)", shape)
  pos = 0

  def parse():  # a nested list of array shapes
    nonlocal pos
    tok = tokens[pos]
    pos += 1
    if tok != "(":
      return tok
    items = []
    while pos < len(tokens) and tokens[pos] != ")":
      items.append(parse())
    pos += 1
    return items

  try:
    node = parse()
    for i in index.split(","):
      node = node[int(i)]
  except (IndexError, TypeError, ValueError):
    return ""
  return node if isinstance(node, str) else ""


def summarize(dump_dir: str, module: str = "jit_step") -> PeakReport:
  """Reads the peak's live set of ``module`` from an XLA dump directory.

  Raises:
    FileNotFoundError: see :func:`find_dump`.
    ValueError: If the live-range file has no peak section (an XLA that
      does not write one).
  """
  live_path, hlo_path = find_dump(dump_dir, module)
  info = _hlo_info(hlo_path)
  kinds, temps = _buffer_kinds(live_path[:-len("-live-range.txt")] +
                               "-buffer-assignment.txt")
  schedule, peak, raw, section, ranges = [], None, [], None, []
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
      if s.startswith("BufferLiveRange"):
        section = "ranges"
        continue
      if s.startswith("Stack trace"):
        section = None
        continue
      if section == "seq":
        m = re.match(r"\d+:(\S+)", s)
        if m:
          schedule.append(m.group(1))
      elif section == "ranges":  # e.g. "fusion.3{0}:10880-10884"
        m = re.match(r"([\w.\-]+)\{([\d,]*)\}:(\d+)-(\d+)$", s)
        if m:
          ranges.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4))))
      elif section == "peak":
        m = re.match(r"([\w.\-]+)\{([\d,]*)\}: (\d+) bytes", s)
        if m:
          raw.append((m.group(1), m.group(2), int(m.group(3))))
  if peak is None:
    raise ValueError(f"{live_path!r} has no 'Live ranges at N (peak)' section")

  def value(name, index, nbytes):
    shape, op, is_param = info.get(name, ("", "", False))
    if index and shape.startswith("("):  # one element of a tuple
      shape = _tuple_element(shape, index)
    op = re.sub(r"(^|-> )jit\(\w+\)/", r"\1", op)
    kind, slot, _ = kinds.get((name, index), ("?", None, 0))
    return Value(name, index, nbytes, shape, op, is_param, kind, slot)

  values = sorted((value(*r) for r in raw), key=lambda v: (-v.bytes, v.name))
  module_name = os.path.basename(live_path)[:-len("-live-range.txt")]
  return PeakReport(module_name, peak, len(schedule), tuple(schedule),
                    tuple(values), hlo_found=bool(info),
                    temp_peak=_temp_peak(ranges, kinds, temps, value))


def _temp_peak(ranges, kinds, temps, value) -> TempPeak | None:
  """The moment the most bytes of the temp allocation are live.

  A value is live from the first to the last instruction of its range, both
  included (XLA's convention: its peak section lists what these ranges say
  is live there). Values live at once in one slot (an in-place op's operand
  and result) share its bytes: the slot counts once, at the largest of them.
  """
  if not temps or not ranges:
    return None
  by_slot = collections.defaultdict(list)
  for name, index, start, end in ranges:
    kind, slot, size = kinds.get((name, index), ("?", None, 0))
    if kind == "temp" and start <= end:
      by_slot[slot].append((start, end, size, name, index))
  if not by_slot:
    return None
  n = max(end for spans in by_slot.values() for _, end, *_ in spans) + 2
  delta = [0] * n
  for spans in by_slot.values():
    # The slot's bytes in use change only where one of its values starts or
    # ends: between two such points, the largest value live.
    events = collections.defaultdict(list)
    for s, e, z, *_ in spans:
      events[s].append((z, 1))
      events[e + 1].append((z, -1))
    active, used = collections.Counter(), 0  # sizes of the values live
    for p in sorted(events):
      for z, sign in events[p]:
        active[z] += sign
        if not active[z]:
          del active[z]
      now = max(active, default=0)
      delta[p] += now - used
      used = now
  live, best, best_at = 0, -1, 0
  for t in range(n - 1):
    live += delta[t]
    if live > best:
      best, best_at = live, t
  there = [value(name, index, size) for spans in by_slot.values()
           for s, e, size, name, index in spans if s <= best_at <= e]
  there.sort(key=lambda v: (-v.bytes, v.name))
  return TempPeak(sum(temps.values()), best, best_at, tuple(there))


def _size(nbytes: int) -> str:
  """GiB from 1 GiB up, else MiB, KiB or bytes."""
  for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if nbytes >= scale:
      return f"{nbytes / scale:.3f} {unit}"
  return f"{nbytes} B"


def _tail(op: str, width: int = 120) -> str:
  """The end of a long op name, cut at a '/'."""
  if len(op) <= width:
    return op
  cut = op[-width:]
  return "…/" + cut.split("/", 1)[1] if "/" in cut else "…" + cut


def format_report(report: PeakReport, top: int = 40) -> str:
  """The report as text: totals, the schedule around the peak, the largest
  values outside argument buffers and the same grouped by operation."""
  lines = [
      f"{report.module}: peak at instruction {report.peak_index} of "
      f"{report.schedule_length}",
      f"live at the peak: {_size(report.live_bytes)} = the step's arguments "
      f"{_size(report.parameter_bytes)} + other values {_size(report.other_bytes)}",
      "by buffer: " + ", ".join(
          f"{k} {_size(report.bytes_in(k))}"
          for k in BUFFER_KINDS if report.bytes_in(k)) + " (argument: the arguments and the values "
      "written in place over them)",
      "schedule around the peak:"]
  if not report.hlo_found:
    lines.insert(2, "(no optimized HLO beside the live ranges: parameters are "
                 "counted as other, shapes and ops are unknown)")
  lo = max(0, report.peak_index - 4)
  for i, name in enumerate(report.schedule[lo:report.peak_index + 3], lo):
    lines.append(f"  {'>' if i == report.peak_index else ' '} {i:6d} {name}")
  others = report.others()
  lines.append(f"largest values outside argument buffers ({len(others)} in all):")
  lines += [_value_line(v, v.buffer) for v in others[:top]]
  lines.append("the same by operation (layer index as N):")
  for op, nbytes, n in report.grouped()[:top]:
    lines.append(f"  {nbytes / 2**20:10.2f} MiB  {n:4d} × {_tail(op)}")
  tp = report.temp_peak
  if tp is not None:
    at = report.schedule[tp.index] if tp.index < len(report.schedule) else "?"
    lines += [
        f"temp allocation: {_size(tp.allocation_bytes)}; the most of it live "
        f"at once: {_size(tp.live_bytes)}, at instruction {tp.index} ({at}); "
        f"{_size(tp.allocation_bytes - tp.live_bytes)} of it is never live "
        "together with that (values placed apart, alignment)",
        f"largest values there ({len(tp.values)} in all):"]
    lines += [_value_line(v) for v in tp.values[:top]]
  return "\n".join(lines)


def _value_line(v: Value, buffer: str | None = None) -> str:
  """One value of a report's list: MiB, [its buffer,] shape, name, op."""
  idx = f"{{{v.index}}}" if v.index else ""
  kind = "" if buffer is None else f"{buffer:8s} "
  return (f"  {v.bytes / 2**20:10.2f} MiB  {kind}{v.shape:24s} "
          f"{v.name}{idx}  {_tail(v.op_name)}")


def main(argv=None) -> PeakReport:
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("dump_dir", help="the --xla_dump_to directory")
  p.add_argument("--module",
                 help="the module: jit_<name of the jitted function> (default: "
                 "jit_step if dumped, else the only module dumped)")
  p.add_argument("--top", type=int, default=40, help="rows per list")
  a = p.parse_args(argv)
  module = a.module
  if module is None:
    found = dumped_modules(a.dump_dir)
    module = ("jit_step" if "jit_step" in found or not found
              else found[0] if len(found) == 1 else None)
    if module is None:
      p.error(f"{a.dump_dir} holds several modules, {found}: choose one "
              "with --module")
  try:
    report = summarize(a.dump_dir, module)
  except (FileNotFoundError, ValueError) as e:
    p.error(str(e))
  print(format_report(report, a.top))
  return report


if __name__ == "__main__":
  main()
