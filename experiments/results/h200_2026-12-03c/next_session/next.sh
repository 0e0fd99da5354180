# For the next GPU session (not run in stop 28; about 8-9 device-minutes in one call).
# 1. the default kernel at the 8B shapes since stop 28 changed it (64x32 sub-tiles, scalars per tile);
# 2. the 8B step, unrolled, T=2048, optax against forge-bf16 and forge-int8 with the faster kernel.
source devrun/env.sh
timeout 150 python -m pytest -q tests/test_fused_mosaic.py -k 8b_shapes > $OUT/pytest_8b.log 2>&1
tail -3 $OUT/pytest_8b.log
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --timeout 140 --out $OUT"
timeout $(( 585 - SECONDS )) $M --tokens 2048 --optimizers optax,forge-bf16,forge-int8 --layouts unrolled+remat > $OUT/table.log 2>&1
echo "rc=$?" >> $OUT/table.log
kill $SMI
grep "^| llama\|rc=" $OUT/table.log
