"""Summarize XLA's memory-usage report / buffer assignment of the step."""
import glob, os, re, shutil, sys
d, out = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(d, "*")))
print("dump files:", len(files), "MB:", sum(os.path.getsize(f) for f in files) // 2**20)
rep = [f for f in files if "memory-usage-report" in f and "step" in f]
ba = [f for f in files if f.endswith("buffer-assignment.txt") and "step" in f]
print("reports:", [os.path.basename(f) for f in rep], "ba:", [os.path.basename(f) for f in ba])
for f in rep[-1:]:
  shutil.copy(f, os.path.join(out, "memory_usage_report.txt"))
  print(open(f).read()[:6000])
for f in ba[-1:]:
  # allocations with sizes
  allocs = []
  for line in open(f):
    m = re.match(r"allocation (\d+): size (\d+)(.*)", line)
    if m:
      allocs.append((int(m.group(2)), line.strip()[:200]))
  allocs.sort(reverse=True)
  print("largest allocations:")
  for s, l in allocs[:25]:
    print(f"{s/2**30:8.3f} GiB  {l}")
