# stop 47 call J: T=512 scan+remat, forge-bf16 and optax (the 1.2x goal), compile-first
source devrun/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
PYTHONPATH=. timeout 170 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --timeout 80 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false --compile-first --implementation auto --layouts scan+remat --optimizers forge-bf16,optax --out $OUT/t512 > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
cat $OUT/gpu.txt; grep -h "^| llama\|rc=\|PHASE" $OUT/t512.log | cut -c1-400
kill $SMI
