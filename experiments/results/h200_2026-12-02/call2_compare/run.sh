# stop 21 call 2: the post-update barrier (committed) against the code without it, same session
source devrun/env.sh
C="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --timeout 220"
timeout 130 python -m experiments.memory_llama $C --optimizers forge-int8 --layouts scan+remat --out $OUT > $OUT/new_int8_scan.log 2>&1
(cd devrun/alt_old && PYTHONPATH=$PWD timeout 230 python -m experiments.memory_llama $C --optimizers forge-int8 --layouts unrolled+remat --out $OUT > $OUT/old_int8_unrolled.log 2>&1)
timeout 230 python -m experiments.memory_llama $C --optimizers forge-bf16 --layouts unrolled+remat --out $OUT > $OUT/new_bf16_unrolled.log 2>&1
grep -h "^| llama" $OUT/*.log | cut -c1-330
