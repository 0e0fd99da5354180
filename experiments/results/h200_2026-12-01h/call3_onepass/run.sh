source devrun/env.sh
timeout 150 python -m experiments.bench_embed_update > $OUT/bench_embed_update.log 2>&1; tail -8 $OUT/bench_embed_update.log
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --tokens 2048 --implementation auto --out $OUT"
timeout 285 $M --optimizers forge-int8 --layouts unrolled+remat --timeout 280 > $OUT/m8b_T2048_int8_unrolled_embed.log 2>&1
grep "^| llama" $OUT/m8b_T2048_int8_unrolled_embed.log
timeout 150 $M --optimizers forge-int8 --layouts scan+remat --timeout 145 > $OUT/m8b_T2048_int8_scan_embed.log 2>&1
grep "^| llama" $OUT/m8b_T2048_int8_scan_embed.log
