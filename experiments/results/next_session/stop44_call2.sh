# Stop 44's second call, not reached (no machine started). Same setup as stop44_call1.sh.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --implementation auto --compiler-options xla_gpu_enable_triton_gemm=false --compile-first"
PYTHONPATH=. timeout 330 $M --timeout 160 --tokens 2048 --layouts scan,unrolled --optimizers forge-bf16,optax --out $OUT/t2048 > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
PYTHONPATH=. timeout 240 $M --timeout 150 --tokens 2048,512 --layouts scan+remat,scan --optimizers forge-int8 --out $OUT/int8 > $OUT/int8.log 2>&1; echo "rc=$?" >> $OUT/int8.log
kill $SMI
grep -h "^| llama\|rc=\|WARNING\|^  llama" $OUT/*.log | cut -c1-420
