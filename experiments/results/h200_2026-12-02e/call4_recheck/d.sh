# stop 25 call D: is the 5120->1024 T=2048 fp32 row (0.135 ms in call B's table, 0.093 in its probe) repeatable? x through the view vs transposed
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
for i in 1 2; do
timeout 80 python -m experiments.bench_fused_dw --shapes 2048:5120x1024,2048:4096x1024,2048:4096x4096 --rules adamw --modes fp32,bf16-sr-bf16 --mosaic --no-triton --reps 30 --chain 3 --out /tmp/b$i > $OUT/bench_$i.log 2>&1
grep "^| 2048" $OUT/bench_$i.log | cut -d'|' -f2-12
done
timeout 60 python -m experiments.probe_mosaic --shapes 2048:5120x1024,2048:4096x4096 --modes fp32 --configs m128n128t64s3,m128n128t64s3noT --reps 30 > $OUT/probe.log 2>&1
grep "^##" $OUT/probe.log
