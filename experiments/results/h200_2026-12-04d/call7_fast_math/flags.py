"""Stop 39: run a module (runpy, as -m) with FORGE_FAST=1 (kernel_mosaic.FAST_MATH)
and/or FORGE_PAIR=1 (precision.PAIRED_BITS) set before anything is traced."""
import os, runpy, sys
import pallas_kernels.precision as precision
from pallas_kernels.fused_dw import kernel_mosaic
kernel_mosaic.FAST_MATH = os.environ.get("FORGE_FAST") == "1"
precision.PAIRED_BITS = os.environ.get("FORGE_PAIR") == "1"
print("FAST_MATH", kernel_mosaic.FAST_MATH, "PAIRED_BITS", precision.PAIRED_BITS, flush=True)
mod = sys.argv[1]
sys.argv = [mod] + sys.argv[2:]
if mod == "pytest":
  import pytest
  sys.exit(pytest.main(sys.argv[1:]))
runpy.run_module(mod, run_name="__main__")
