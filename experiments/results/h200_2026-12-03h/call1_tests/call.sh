# For the next GPU session (not run in stop 32), a call of its own: the GPU tests of the 8B shapes
# with stop 32's kernel default (x through the transposed view for bf16 at T=2048). Stop 29 ran
# them with the old default: 12 passed. Copy to devrun/ and run with carry ["devrun"].
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false PYTHONPATH=.
timeout 400 python -m pytest -q tests/test_fused_mosaic.py -k 8b_shapes 2>&1 | tee $OUT/pytest_8b.log | tail -5
