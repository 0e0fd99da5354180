# stop 34 call 6: scanned 8B T=2048 int8: late kernel reads ordered after the previous update (mark_done), this tree
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 8 --pipelined 8 --layouts scan+remat --tokens 2048 --optimizers forge-int8"
mkdir -p $OUT/new
PYTHONPATH=. timeout 125 python -m experiments.memory_llama $A --out $OUT/new --timeout 120 --peak-report > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
PYTHONPATH=. timeout $(( 195 - SECONDS )) python -m pytest -q -x tests/test_llama.py -k "late or equals_unrolled" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama\|passed\|failed" $f | cut -c1-330; done
kill $SMI
