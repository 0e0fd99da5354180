# For a session that is lent nvidia-h200-x2 (not run yet): issue 6's TP=2 figures with the
# committed code (last measured before stop 16, Triton kernel). Copy to devrun/ with
# ../env.sh as devrun/env.sh and run with kind "nvidia-h200-x2", carry ["devrun"]. The
# int8 and bf16 rows, scanned and unrolled, memory per GPU and step time; the TP=1 optax row
# for reference comes from call 3 of this stop (one GPU). About 8-9 device-minutes: the
# scanned variants take about 70 s each, the unrolled about 160 s.
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --tp 2 --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 10 --pipelined 10 --tokens 2048 --out $OUT"
timeout 250 python -m experiments.memory_llama $A --timeout 110 --optimizers forge-int8,forge-bf16 --layouts scan+remat > $OUT/tp2_scan.log 2>&1; echo "rc=$?" >> $OUT/tp2_scan.log
timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --timeout 190 --optimizers forge-int8 --layouts unrolled+remat > $OUT/tp2_unrolled.log 2>&1; echo "rc=$?" >> $OUT/tp2_unrolled.log
for f in $OUT/tp2*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
