# stop 47 call I: forge-int8 scan+remat at T=2048, compile-first (the issue-6 headline row; stop 47's first try's logs were lost with its machine)
source devrun/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
PYTHONPATH=. timeout 200 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --pipelined 2 --timeout 195 --tokens 2048 --compiler-options xla_gpu_enable_triton_gemm=false --compile-first --implementation auto --layouts scan+remat --optimizers forge-int8 --out $OUT/int8 > $OUT/t2048_int8.log 2>&1; echo "rc=$?" >> $OUT/t2048_int8.log
cat $OUT/gpu.txt; grep -h "^| llama\|rc=\|PHASE" $OUT/t2048_int8.log | cut -c1-400
kill $SMI
