# stop 34 call 3: scanned 8B T=2048: late kernel reads + each stacked layer's update ordered before the rest of the backward (this tree) against stop 33's tree (devrun/old)
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 10 --pipelined 10 --layouts scan+remat --tokens 2048"
mkdir -p $OUT/new $OUT/old
PYTHONPATH=. timeout 200 python -m experiments.memory_llama $A --out $OUT/new --timeout 95 --peak-report --optimizers forge-int8,forge-bf16 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && PYTHONPATH=. timeout 180 python -m experiments.memory_llama $A --out $OUT/old --timeout 85 --optimizers forge-int8,forge-bf16 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
