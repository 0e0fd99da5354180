# Stop 31, call 1: unrolled 8B T=2048, profiled (device kernels, idle time, host events) and each
# row's command-buffer summary. New tree (probes pass through: every output but two aliased)
# optax + forge-bf16; then the old tree's forge-bf16 (new zeros for the probes) in the same
# call; then the new forge-bf16 with command buffers off, if time is left.
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --layouts unrolled+remat --profile --steps 6 --out $OUT"
PYTHONPATH=. timeout 270 python -m experiments.memory_llama $A --timeout 200 --optimizers optax,forge-bf16 > $OUT/new_on.log 2>&1; echo "rc=$?" >> $OUT/new_on.log
(cd devrun/old && PYTHONPATH=. timeout 180 python -m experiments.memory_llama $A --timeout 170 --optimizers forge-bf16 > $OUT/old_on.log 2>&1; echo "rc=$?" >> $OUT/old_on.log)
XLA_FLAGS=--xla_gpu_enable_command_buffer= PYTHONPATH=. timeout $(( 592 - SECONDS )) python -m experiments.memory_llama $A --timeout 170 --optimizers forge-bf16 > $OUT/new_off.log 2>&1; echo "rc=$?" >> $OUT/new_off.log
for f in $OUT/new_on.log $OUT/old_on.log $OUT/new_off.log; do echo "== $f"; grep "command buffers\|^| llama\|^host:\|^first start\|rc=" $f | cut -c1-300; done
kill $SMI
