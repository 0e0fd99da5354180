# Stop 32, call 3: forge (bf16 moments) at T=2048, unrolled+remat, XLA's defaults against command
# buffers off (call 2's forge rows ran out of their time limit), then optax.adamw again.
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 4 --layouts unrolled+remat --tokens 2048 --out $OUT"
CB=xla_gpu_enable_command_buffer=
timeout 370 python -m experiments.memory_llama $A --timeout 180 --optimizers forge-bf16 \
  --compiler-options "$CB" --compiler-options "" > $OUT/forge.log 2>&1; echo "rc=$?" >> $OUT/forge.log
timeout $(( 475 - SECONDS )) python -m experiments.memory_llama $A --timeout 100 --optimizers optax > $OUT/optax.log 2>&1; echo "rc=$?" >> $OUT/optax.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
