# stop 35 call 4: the table at T=2048 from one memory_llama run with this tree: optax, forge-bf16, forge-int8,
# each unrolled and scanned with per-block remat, peak reports; everything tarred into one file (the tool's file count)
source devrun/env.sh
mkdir -p $OUT/t2048
PYTHONPATH=. timeout $(( 575 - SECONDS )) python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 4 --tokens 2048 --optimizers optax,forge-bf16,forge-int8 --layouts unrolled+remat,scan+remat --out $OUT/t2048 --timeout 200 --peak-report > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
kill $SMI
cp $OUT/t2048.log $OUT/smi.csv $OUT/t2048/ && (cd $OUT && tar czf call4.tgz t2048 && rm -rf t2048 smi.csv)
grep "^| llama\|rc=\|^  llama\|^| model" $OUT/t2048.log | cut -c1-330
