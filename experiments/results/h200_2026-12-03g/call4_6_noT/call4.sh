# Stop 32, call 4: the default bf16 ping-pong tile at T=2048 with x transposed by XLA (as now)
# against x read through a transposed shared-memory view (noT), per op incl. the transpose.
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false PYTHONPATH=.
python -m experiments.probe_mosaic --shapes 2048:14336x4096,2048:4096x14336 --modes bf16-sr \
  --configs PP_n128s4e32,PP_n128s4e32noT --no-triton 2>&1 | tee $OUT/probe.log | grep -v "^WARNING\|DeprecationWarning" | tail -20
