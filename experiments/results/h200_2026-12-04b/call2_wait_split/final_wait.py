"""Stop 37: the epilogue's last store wait, full against read-only, same process, alternating."""
import sys
from experiments import probe_mosaic
from pallas_kernels.fused_dw import kernel_mosaic
argv = sys.argv[1:]
out = []
for flag in (False, True, False, True):
  kernel_mosaic.FINAL_WAIT_READ_ONLY = flag
  print(f"### FINAL_WAIT_READ_ONLY={flag}", flush=True)
  out += [f"read_only={flag} {l}" for l in probe_mosaic.main(argv)]
print("\n".join(out))
