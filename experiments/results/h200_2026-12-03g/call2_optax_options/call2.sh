# Stop 32, call 2: optax.adamw against forge (bf16 moments), unrolled+remat, XLA's defaults against
# command buffers off for the step (jax.jit compiler_options), T=2048 then T=512; every row has the
# waited-for step time and the pipelined one (4 steps dispatched back to back).
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 4 --layouts unrolled+remat --out $OUT"
CB=xla_gpu_enable_command_buffer=
timeout 360 python -m experiments.memory_llama $A --tokens 2048 --timeout 120 --optimizers optax,forge-bf16 \
  --compiler-options "" --compiler-options "$CB" > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --tokens 512 --timeout 110 --optimizers optax,forge-bf16 \
  --compiler-options "$CB" > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
