export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 1000 > $OUT/smi.csv 2>&1 &
SMI=$!
