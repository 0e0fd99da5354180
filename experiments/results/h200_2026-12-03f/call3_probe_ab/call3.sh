# Stop 31, call 3: the probes passed through (new) against new zeros (old tree), unrolled 8B
# T=2048 forge-bf16, default flags, 8 steps each (median of the last 6), old first.
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --layouts unrolled+remat --steps 8 --optimizers forge-bf16 --out $OUT"
(cd devrun/old && PYTHONPATH=. timeout 160 python -m experiments.memory_llama $A --timeout 155 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
PYTHONPATH=. timeout $(( 325 - SECONDS )) python -m experiments.memory_llama $A --timeout 160 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
for f in $OUT/old.log $OUT/new.log; do echo "== $f"; grep "^| llama\|rc=" $f | cut -c1-260; grep -o '"losses": \[[^]]*\]' $f; done
kill $SMI
