# stop 37 call 3: fj.SCAN_GPU_COMPILER_OPTIONS beyond the scanned T=512 step. (a) unrolled T=2048,
# optax against forge-bf16, both under the options; (b) which of the three options matter alone
# (scanned T=512 forge-bf16, one option left out at a time); (c) Qwen3-32B int8 under them.
source devrun/env.sh
ML="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 110"
PYTHONPATH=. timeout 250 $ML --tokens 2048 --layouts unrolled+remat --optimizers optax,forge-bf16 --compiler-options scan --out $OUT/u2048 > $OUT/u2048.log 2>&1; echo "rc=$?" >> $OUT/u2048.log
PYTHONPATH=. timeout 170 $ML --tokens 512 --layouts scan+remat --optimizers forge-bf16 --compiler-options xla_gpu_enable_dynamic_slice_fusion=true,xla_gpu_enable_cublaslt=false --compiler-options xla_gpu_enable_dynamic_slice_fusion=true,xla_gpu_enable_triton_gemm=false --compiler-options xla_gpu_enable_cublaslt=false,xla_gpu_enable_triton_gemm=false --out $OUT/alone > $OUT/alone.log 2>&1; echo "rc=$?" >> $OUT/alone.log
PYTHONPATH=. timeout 120 $ML --model qwen3-32b --tokens 2048 --layouts scan+remat --optimizers forge-int8 --steps 4 --compiler-options scan --out $OUT/qwen > $OUT/qwen.log 2>&1; echo "rc=$?" >> $OUT/qwen.log
kill $SMI
grep -h "^| \(llama\|qwen\)\|rc=" $OUT/*.log | cut -c1-330
