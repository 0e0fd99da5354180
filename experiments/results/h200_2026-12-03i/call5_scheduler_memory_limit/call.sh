# stop 34 call 5: scanned 8B T=2048 int8: XLA's scheduler told a small memory limit (xla_gpu_memory_limit_slop_factor), this tree (late reads) and stop 33's tree
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 6 --layouts scan+remat --tokens 2048"
mkdir -p $OUT/new $OUT/old $OUT/newbf16
PYTHONPATH=. timeout 230 python -m experiments.memory_llama $A --out $OUT/new --timeout 110 --peak-report --optimizers forge-int8 --compiler-options xla_gpu_memory_limit_slop_factor=1 --compiler-options xla_gpu_memory_limit_slop_factor=3 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && PYTHONPATH=. timeout 120 python -m experiments.memory_llama $A --out $OUT/old --timeout 110 --peak-report --optimizers forge-int8 --compiler-options xla_gpu_memory_limit_slop_factor=1 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
PYTHONPATH=. timeout $(( 560 - SECONDS )) python -m experiments.memory_llama $A --out $OUT/newbf16 --timeout 110 --optimizers forge-bf16 --compiler-options xla_gpu_memory_limit_slop_factor=1 > $OUT/newbf16.log 2>&1; echo "rc=$?" >> $OUT/newbf16.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
