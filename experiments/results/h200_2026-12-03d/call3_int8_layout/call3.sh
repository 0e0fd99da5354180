# Stop 29, call 3: int8 moments with their scales stored in the kernel's layout (no
# transposes): the 8B step's temp, scanned then unrolled, T=2048, with XLA's peak report.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --implementation auto --timeout 170 --out $OUT"
timeout 175 $M --peak-report --tokens 2048 --optimizers forge-int8 --layouts scan+remat > $OUT/scan.log 2>&1
echo "rc=$?" >> $OUT/scan.log
grep "^| llama\|rc=" $OUT/scan.log
timeout $(( ${LIMIT:-300} - SECONDS )) $M --tokens 2048 --optimizers forge-int8 --layouts unrolled+remat > $OUT/unrolled.log 2>&1
echo "rc=$?" >> $OUT/unrolled.log
grep "^| llama\|rc=" $OUT/unrolled.log
kill $SMI
