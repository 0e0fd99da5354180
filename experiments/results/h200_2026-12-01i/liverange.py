"""What is live at the peak of a jitted step: reads XLA's dumped live-range and HLO.

usage: python devrun/liverange.py DUMP_DIR [module_substring]
"""
import collections, glob, os, re, sys

d = sys.argv[1]
sub = sys.argv[2] if len(sys.argv) > 2 else "jit_step"
lr = sorted(f for f in glob.glob(os.path.join(d, "*live-range.txt")) if sub in f)
if not lr:
  print("no live-range file for", sub, "in", d); sys.exit(0)
lrf = lr[-1]
hlof = lrf.replace("-live-range.txt", ".txt")
print("files:", os.path.basename(lrf), os.path.getsize(lrf) // 1024, "KB;", os.path.basename(hlof))

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
         "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def nbytes(shape):
  m = re.match(r"(\w+)\[([\d,]*)\]", shape)
  if not m or m.group(1) not in BYTES:
    return 0
  n = 1
  for x in filter(None, m.group(2).split(",")):
    n *= int(x)
  return n * BYTES[m.group(1)]


info = {}  # name -> (shape, op_name, is_param)
entry = False
for line in open(hlof):
  if line.startswith("ENTRY"):
    entry = True
    continue
  if entry and line.startswith("}"):
    entry = False
  m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\(?[\w\[\]{},:\s]*?\)?)\s*([\w\-]+)\(", line)
  if not m:
    continue
  name, shape, op = m.group(1), m.group(2).strip(), m.group(3)
  opn = re.search(r'op_name="([^"]*)"', line)
  info[name] = (shape.split("{")[0], opn.group(1) if opn else op, entry and op == "parameter")

seq, ranges, peak_vals, peak_at, section = {}, [], [], None, None
for line in open(lrf):
  s = line.strip()
  if s.startswith("InstructionSequence"):
    section = "seq"; continue
  if s.startswith("BufferLiveRange"):
    section = "ranges"; continue
  m = re.match(r"Live ranges at (\d+)", s)
  if m:
    section, peak_at = "peak", int(m.group(1)); continue
  if s.startswith("Stack trace"):
    section = None; continue
  if section == "seq":
    m = re.match(r"(\d+):(.*)", s)
    if m: seq[int(m.group(1))] = m.group(2)
  elif section == "ranges":
    m = re.match(r"([\w.\-]+)\{([\d,]*)\}:(\d+)-(\d+)", s)
    if m: ranges.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4))))
  elif section == "peak":
    m = re.match(r"([\w.\-]+)\{([\d,]*)\}: (\d+) bytes", s)
    if m: peak_vals.append((m.group(1), m.group(2), int(m.group(3))))


def short(op):
  op = re.sub(r"jit\(step\)/", "", op)
  return op[-110:]


def is_param(n):
  return info.get(n, ("", "", False))[2]


tot = sum(b for *_, b in peak_vals)
par = sum(b for n, _, b in peak_vals if is_param(n))
print(f"peak at {peak_at} / {max(seq) if seq else '?'}: {seq.get(peak_at)}  "
      f"live {tot/2**30:.3f} GiB, of which parameters {par/2**30:.3f}, other {(tot-par)/2**30:.3f}")
print("around the peak:")
for t in range(peak_at - 6, peak_at + 4):
  n = seq.get(t, "")
  print(f"  {t:6d} {n:38s} {info.get(n, ('', ''))[0][:30]:30s} {short(info.get(n, ('', ''))[1])}")
print("non-parameter values live at the peak, largest first:")
rows = sorted(((b, n, i) for n, i, b in peak_vals if not is_param(n)), reverse=True)
groups = collections.Counter()
for b, n, i in rows:
  shape, op, _ = info.get(n, ("?", "?", False))
  key = re.sub(r"layers_\d+", "layers_N", short(op))
  groups[key] += b
for b, n, i in rows[:45]:
  shape, op, _ = info.get(n, ("?", "?", False))
  print(f"  {b/2**20:9.2f} MiB {n}{{{i}}} {shape[:40]} | {short(op)}")
print(f"  ... {len(rows)} values")
print("grouped (layer index dropped):")
for k, b in groups.most_common(25):
  print(f"  {b/2**20:9.2f} MiB  {k}")

# live non-parameter bytes along the schedule (sizes from HLO shapes; tuples 0)
T = max(seq) + 2 if seq else 0
delta = [0] * (T + 2)
for n, i, a, b in ranges:
  if is_param(n) or n not in info:
    continue
  shape = info[n][0]
  if i:  # tuple element: find i-th element shape
    parts = re.findall(r"\w+\[[\d,]*\]", shape)
    idx = int(i.split(",")[0])
    shape = parts[idx] if idx < len(parts) else ""
  elif shape.startswith("("):
    continue
  sz = nbytes(shape)
  delta[a] += sz
  delta[min(b, T) + 1] -= sz
cur, curve = 0, []
for t in range(T):
  cur += delta[t]
  curve.append(cur)
if curve:
  top = max(range(T), key=lambda t: curve[t])
  print(f"estimated non-parameter live bytes: max {curve[top]/2**30:.3f} GiB at {top} ({seq.get(top)})")
  step = max(1, T // 50)
  for t in range(0, T, step):
    t2 = max(range(t, min(T, t + step)), key=lambda u: curve[u])
    n = seq.get(t2, "")
    print(f"  {t2:6d} {curve[t2]/2**30:7.3f} GiB  {short(info.get(n, ('', ''))[1])[-80:]}")
