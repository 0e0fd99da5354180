# Stop 29, call 2: the 8B step, unrolled + per-block remat, optax against forge with the
# reciprocal bias corrections and stop 28's kernel defaults: T=2048, then T=512.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --timeout 150 --out $OUT"
timeout 340 $M --tokens 2048 --optimizers optax,forge-bf16,forge-int8 --layouts unrolled+remat > $OUT/table_2048.log 2>&1
echo "rc=$?" >> $OUT/table_2048.log
grep "^| llama\|rc=" $OUT/table_2048.log
timeout $(( 588 - SECONDS )) $M --tokens 512 --optimizers optax,forge-bf16 --layouts unrolled+remat > $OUT/table_512.log 2>&1
echo "rc=$?" >> $OUT/table_512.log
grep "^| llama\|rc=" $OUT/table_512.log
kill $SMI
