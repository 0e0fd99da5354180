"""Definitions and users of the largest non-parameter values live at the step's peak."""
import glob, os, re, sys
d, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
lrf = sorted(f for f in glob.glob(os.path.join(d, "*live-range.txt")) if "jit_step" in f)[-1]
hlo = open(lrf.replace("-live-range.txt", ".txt")).read().splitlines()
params = set(re.findall(r"%?([\w.\-]+) = [^\n]*? parameter\(", "\n".join(hlo)))
vals, on = [], False
for line in open(lrf):
  if "(peak)" in line: on = True; continue
  if on and "Stack trace" in line: break
  m = on and re.match(r"\s*([\w.\-]+)\{[\d,]*\}: (\d+) bytes", line)
  if m and m.group(1) not in params: vals.append((int(m.group(2)), m.group(1)))
seen = set()
for b, name in sorted(vals, reverse=True):
  kind = re.sub(r"\.\d+$", "", name)
  if kind in seen: continue
  seen.add(kind)
  if len(seen) > n: break
  print(f"== {name} ({b/2**20:.1f} MiB)")
  pat_def = re.compile(rf"^\s*(ROOT )?%?{re.escape(name)} = ")
  pat_use = re.compile(rf"%{re.escape(name)}[,)\s]")
  users = 0
  for l in hlo:
    if pat_def.match(l): print("  def:", l.strip()[:600])
    elif pat_use.search(l) and users < 3:
      users += 1; print("  use:", l.strip()[:400])
