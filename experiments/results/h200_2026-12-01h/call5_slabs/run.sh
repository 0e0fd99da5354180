source devrun/env.sh
timeout 120 python -m experiments.bench_embed_update > $OUT/bench_embed_update.log 2>&1; tail -11 $OUT/bench_embed_update.log
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --out $OUT"
timeout 275 $M --tokens 2048 --optimizers forge-int8 --layouts unrolled+remat --embedding fused --timeout 270 > $OUT/m8b_T2048_int8_unrolled_embed_slabs.log 2>&1
grep "^| llama" $OUT/m8b_T2048_int8_unrolled_embed_slabs.log
