source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --out $OUT"
timeout 250 $M --tokens 2048 --optimizers forge-bf16 --layouts unrolled+remat --timeout 245 > $OUT/m8b_T2048_bf16_unrolled_embed.log 2>&1
grep "^| llama" $OUT/m8b_T2048_bf16_unrolled_embed.log
timeout 95 $M --tokens 512 --optimizers optax --layouts unrolled+remat --timeout 90 > $OUT/m8b_T512_optax_unrolled.log 2>&1
grep "^| llama" $OUT/m8b_T512_optax_unrolled.log
timeout 95 $M --tokens 512 --optimizers forge-bf16 --layouts scan+remat --timeout 90 > $OUT/m8b_T512_bf16_scan_embed.log 2>&1
grep "^| llama" $OUT/m8b_T512_bf16_scan_embed.log
