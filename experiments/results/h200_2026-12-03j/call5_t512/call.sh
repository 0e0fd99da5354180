# stop 35 call 5: T=512, the same step: optax and forge-bf16, scanned and unrolled (per-block remat)
source devrun/env.sh
PYTHONPATH=. timeout 280 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 4 --tokens 512 --optimizers optax,forge-bf16 --layouts scan+remat,unrolled+remat --out $OUT --timeout 120 > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
kill $SMI
grep "^| llama\|rc=\|^  llama\|^| model" $OUT/t512.log | cut -c1-330
