# stop 38 call 3: the T=2048 table from one run under fj.SCAN_GPU_COMPILER_OPTIONS (Triton gemms off), both layouts.
source devrun/env.sh
PYTHONPATH=. timeout 580 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 200 --tokens 2048 --layouts scan+remat,unrolled+remat --optimizers optax,forge-bf16,forge-int8 --compiler-options xla_gpu_enable_triton_gemm=false --out $OUT/t2048 > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
kill $SMI
grep -h "^| llama\|rc=" $OUT/t2048.log | cut -c1-330
