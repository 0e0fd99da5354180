# stop 36 call 5: this tree (no matmul barrier for stacked layers) with fj.SCAN_GPU_COMPILER_OPTIONS
# ('--compiler-options scan'): the scanned 8B step at T=2048 (forge-bf16, forge-int8, optax under
# the same options) and at T=512 (forge-bf16).
source devrun/env.sh
ML="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --layouts scan+remat --compiler-options scan --timeout 95"
PYTHONPATH=. timeout 230 $ML --tokens 2048 --optimizers forge-bf16,forge-int8,optax --out $OUT > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
PYTHONPATH=. timeout 70 $ML --tokens 512 --optimizers forge-bf16 --out $OUT > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
kill $SMI
for f in t2048 t512; do grep "^| llama\|rc=\|^  llama" $OUT/$f.log | cut -c1-330; done
