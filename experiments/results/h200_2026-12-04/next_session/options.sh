# Not run yet (stop 36 ran out of device time). From the repository root with devrun/env.sh:
# which of fj.SCAN_GPU_COMPILER_OPTIONS's three options matter alone, the unrolled step and
# Qwen3-32B under them. About 6 minutes on one H200.
source devrun/env.sh
ML="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 100"
PYTHONPATH=. timeout 260 $ML --tokens 512 --layouts scan+remat --optimizers forge-bf16 --compiler-options xla_gpu_enable_dynamic_slice_fusion=true,xla_gpu_enable_cublaslt=false --compiler-options xla_gpu_enable_dynamic_slice_fusion=true,xla_gpu_enable_triton_gemm=false --compiler-options xla_gpu_enable_cublaslt=false,xla_gpu_enable_triton_gemm=false --out $OUT/alone > $OUT/alone.log 2>&1
PYTHONPATH=. timeout 200 $ML --tokens 512 --layouts unrolled+remat --optimizers forge-bf16 --compiler-options scan --out $OUT/unrolled > $OUT/unrolled.log 2>&1
PYTHONPATH=. timeout 120 $ML --model qwen3-32b --tokens 2048 --layouts scan+remat --optimizers forge-int8 --steps 4 --compiler-options scan --out $OUT/qwen > $OUT/qwen.log 2>&1
kill $SMI
grep -h "^| \(llama\|qwen\)" $OUT/*.log | cut -c1-330
