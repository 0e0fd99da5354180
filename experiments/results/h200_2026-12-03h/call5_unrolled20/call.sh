# Third sample of unrolled T=2048 bf16: forge (stop 32's kernel default) then optax, 20+20 steps.
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 20 --pipelined 20 --layouts unrolled+remat --tokens 2048 --out $OUT"
timeout 200 python -m experiments.memory_llama $A --timeout 190 --optimizers forge-bf16 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
timeout $(( 330 - SECONDS )) python -m experiments.memory_llama $A --timeout 120 --optimizers optax > $OUT/optax.log 2>&1; echo "rc=$?" >> $OUT/optax.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
