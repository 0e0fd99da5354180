# stop 47 call K: T=2048 scan+remat, forge-bf16 and optax (the no-slower goal), compile-first
source devrun/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
PYTHONPATH=. timeout 125 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --timeout 60 --tokens 2048 --compiler-options xla_gpu_enable_triton_gemm=false --compile-first --implementation auto --layouts scan+remat --optimizers forge-bf16,optax --out $OUT/t2048 > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
cat $OUT/gpu.txt; grep -h "^| llama\|rc=\|PHASE" $OUT/t2048.log | cut -c1-400
kill $SMI
