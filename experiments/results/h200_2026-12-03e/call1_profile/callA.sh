# For the next GPU session (not run in stop 29). Two calls of about 5 device-minutes each
# (copy to devrun/ with ../../h200_2026-12-03c/call1_audit/env.sh; run with carry ["devrun"]).
# Call A: where the unrolled 8B step's time goes now (T=2048; one profiled step each).
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --timeout 170 --out $OUT"
timeout 380 $M --steps 5 --tokens 2048 --optimizers forge-bf16,optax --layouts unrolled+remat --profile > $OUT/prof.log 2>&1
echo "rc=$?" >> $OUT/prof.log
grep "^| llama\|rc=" $OUT/prof.log
# Call B (a second call): the scanned rows with today's code, one run:
# timeout 560 $M --steps 6 --tokens 2048 --optimizers optax,forge-bf16,forge-int8 --layouts scan+remat > $OUT/scan.log 2>&1
kill $SMI
