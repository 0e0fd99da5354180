# stop 24 call 3: the full fp32 kernel table, 3 ops chained per jitted call, torch in a CUDA graph
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
date +%s > $OUT/t0
timeout 390 python -m experiments.bench_fused_dw --shapes models --rules adamw --modes fp32 --mosaic --torch --reps 30 --chain 3 --out $OUT > $OUT/bench.log 2>&1
echo "rc=$? $(( $(date +%s) - $(cat $OUT/t0) )) s" >> $OUT/bench.log
grep -c '^{"shape"' $OUT/bench.log; grep "^|\|^rc\|^timing\|^floor" $OUT/bench.log | cut -c1-250 | tail -30
