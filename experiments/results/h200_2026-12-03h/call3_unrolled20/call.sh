# Same question as call7 with 20 waited + 20 back-to-back steps per variant (init and compile
# dominate, so more steps cost little), order changed: optax, forge new default, forge old tree.
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 20 --pipelined 20 --layouts unrolled+remat --tokens 2048 --out $OUT"
export PYTHONPATH=.
timeout 150 python -m experiments.memory_llama $A --timeout 140 --optimizers optax > $OUT/optax.log 2>&1; echo "rc=$?" >> $OUT/optax.log
timeout 200 python -m experiments.memory_llama $A --timeout 190 --optimizers forge-bf16 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && PYTHONPATH=. timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --timeout 190 --optimizers forge-bf16 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
