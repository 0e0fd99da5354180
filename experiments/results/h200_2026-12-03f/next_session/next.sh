# For the next GPU session (not run in stop 31); copy to devrun/ with
# ../../h200_2026-12-03c/call1_audit/env.sh and run with carry ["devrun"]. About 9 device-minutes.
# Stop 31 saw the unrolled forge-bf16 step's temp fall from 1.54 to 1.10 GiB with command
# buffers off (same code, same call). Does the same hold for int8 moments, scanned and
# unrolled (the scanned int8 temp goal: within 10% of unrolled), and what do both optimizers'
# steps take then? Every row also gives "step ms, pipelined" (memory_llama --pipelined, default 4:
# steps dispatched back to back, as a loop that does not wait for each loss).
source devrun/env.sh
export PYTHONPATH=. XLA_FLAGS=--xla_gpu_enable_command_buffer=
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --steps 4 --out $OUT"
timeout 330 python -m experiments.memory_llama $A --timeout 160 --optimizers forge-int8 --layouts scan+remat,unrolled+remat > $OUT/int8_off.log 2>&1; echo "rc=$?" >> $OUT/int8_off.log
timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --timeout 150 --optimizers optax,forge-bf16 --layouts unrolled+remat > $OUT/bf16_off.log 2>&1; echo "rc=$?" >> $OUT/bf16_off.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=" $f | cut -c1-250; done
kill $SMI
