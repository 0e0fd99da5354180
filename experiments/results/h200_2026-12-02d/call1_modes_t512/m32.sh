# stop 24 call 1: the full kernel table, ops chained in one jit (bench_fused_dw --timing chain)
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
date +%s > $OUT/t0
timeout 560 python -m experiments.bench_fused_dw --shapes models --rules adamw --modes fp32,bf16-sr-bf16,int8 --mosaic --torch --reps 27 --chain 9 --out $OUT > $OUT/bench.log 2>&1
echo "rc=$? $(( $(date +%s) - $(cat $OUT/t0) )) s" >> $OUT/bench.log
grep -c '^{"shape"' $OUT/bench.log; tail -n 3 $OUT/bench.log | cut -c1-300
grep -E "Traceback|Error" $OUT/bench.log | sort | uniq -c | head -8
