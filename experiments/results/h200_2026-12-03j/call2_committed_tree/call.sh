# stop 35 call 2: the committed tree (15d8774, devrun/old) scanned int8 beside this tree's scanned bf16 and optax, T=2048
source devrun/env.sh
mkdir -p $OUT/old $OUT/new
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 8 --pipelined 8 --tokens 2048 --layouts scan+remat"
(cd devrun/old && PYTHONPATH=. timeout 150 python -m experiments.memory_llama $A --out $OUT/old --timeout 120 --peak-report --optimizers forge-int8 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
PYTHONPATH=. timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --out $OUT/new --timeout 120 --optimizers forge-bf16,optax > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
for f in $OUT/old.log $OUT/new.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
