# For the next GPU session (not run in stop 30). About 10 device-minutes (optax about 80 s, forge about 150 s per run); copy to devrun/ with
# ../../h200_2026-12-03c/call1_audit/env.sh and run with carry ["devrun"].
# Both optimizers' spans and idle time, command buffers on and off, in one call, so the host
# time outside the fused step's kernels (stop 30: 16-31 ms on, 3.6 off) has its optax twin.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --layouts unrolled+remat --profile --steps 6 --out $OUT"
timeout 290 $M --timeout 200 --optimizers optax,forge-bf16 > $OUT/on.log 2>&1; echo "rc=$?" >> $OUT/on.log
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout 290 $M --timeout 200 --optimizers optax,forge-bf16 > $OUT/off.log 2>&1; echo "rc=$?" >> $OUT/off.log
for f in $OUT/on.log $OUT/off.log; do echo "== $f"; grep -A3 "^first start\|^| llama" $f | cut -c1-200; grep "rc=" $f; done
kill $SMI
