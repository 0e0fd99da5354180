# stop 35 call 3: Qwen3-32B scanned int8 T=2048 with this tree (ForgeEmbed's slabs ordered), then the committed tree 15d8774 (devrun/old)
source devrun/env.sh
mkdir -p $OUT/new $OUT/old
A="--model qwen3-32b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 4 --pipelined 4 --tokens 2048 --layouts scan+remat --optimizers forge-int8"
PYTHONPATH=. timeout 330 python -m experiments.memory_llama $A --out $OUT/new --timeout 320 --peak-report > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && PYTHONPATH=. timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --out $OUT/old --timeout 300 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
for f in $OUT/new.log $OUT/old.log; do echo "== $f"; grep "^| qwen\|rc=\|^  qwen\|rror" $f | cut -c1-330; done
kill $SMI
