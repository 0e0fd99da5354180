# Stop 32, call 6: the bf16 ping-pong tile of T >= 8192 with x transposed by XLA against the view (noT).
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false PYTHONPATH=.
python -m experiments.probe_mosaic --shapes 8192:4096x14336 --modes bf16-sr \
  --configs PP_n128s5e32,PP_n128s5e32noT --no-triton 2>&1 | tee $OUT/probe_8192.log | grep "^##"
