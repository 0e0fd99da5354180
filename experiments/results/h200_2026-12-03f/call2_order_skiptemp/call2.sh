# Stop 31, call 2. (1) Scanned int8 step with the head's update now ordered before the scanned
# blocks' backward (peak report). (2) optax and forge-bf16 unrolled T=2048, profiled, with
# XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP (temp buffers at a stable address:
# call 1 showed the step's one CUDA graph re-recorded each step, 1.6-17.9 ms of host time before
# the launch). (3) Scanned bf16 step, if time is left.
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --out $OUT"
timeout 200 python -m experiments.memory_llama $A --steps 4 --timeout 190 --optimizers forge-int8 --layouts scan+remat --peak-report > $OUT/int8_scan.log 2>&1; echo "rc=$?" >> $OUT/int8_scan.log
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP timeout 250 python -m experiments.memory_llama $A --steps 6 --profile --timeout 175 --layouts unrolled+remat --optimizers optax,forge-bf16 > $OUT/skip_temp.log 2>&1; echo "rc=$?" >> $OUT/skip_temp.log
timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --steps 4 --timeout 150 --optimizers forge-bf16 --layouts scan+remat > $OUT/bf16_scan.log 2>&1; echo "rc=$?" >> $OUT/bf16_scan.log
for f in $OUT/int8_scan.log $OUT/skip_temp.log $OUT/bf16_scan.log; do echo "== $f"; grep "^| llama\|rc=\|^host:\|^first start\|command_buffer::\|cuGraphLaunch" $f | cut -c1-260; done
kill $SMI
