# Stop 44 tried this as its first device call five times, stop 45 seven times; no machine started. Run from the repository root with devrun/env.sh (= ../h200_2026-12-03j/env.sh) carried.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --implementation auto"
PYTHONPATH=. timeout 420 $M --compiler-options xla_gpu_enable_triton_gemm=false --timeout 160 --compile-first --tokens 512 --layouts scan,scan+remat,unrolled --optimizers forge-bf16,optax --out $OUT/t512 > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
PYTHONPATH=. timeout 150 $M --compiler-options xla_gpu_enable_triton_gemm=false,xla_gpu_autotune_level=0 --timeout 140 --tokens 512 --layouts scan+remat --optimizers forge-bf16 --out $OUT/noat > $OUT/noat.log 2>&1; echo "rc=$?" >> $OUT/noat.log
kill $SMI
grep -h "^| llama\|rc=\|WARNING\|^  llama" $OUT/*.log | cut -c1-420
