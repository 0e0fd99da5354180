# Stop 32, call 5: as call 4 for 4096x4096 (bf16, ping-pong) and the int8 default tile, and call 4's 14336x4096 again.
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false PYTHONPATH=.
python -m experiments.probe_mosaic --shapes 2048:4096x4096,2048:14336x4096 --modes bf16-sr \
  --configs PP_n128s4e32,PP_n128s4e32noT --no-triton 2>&1 | tee $OUT/probe_bf16.log | grep "^##"
python -m experiments.probe_mosaic --shapes 2048:4096x14336 --modes int8-sr \
  --configs m64n128t64s4,m64n128t64s4noT --no-triton 2>&1 | tee $OUT/probe_int8.log | grep "^##"
