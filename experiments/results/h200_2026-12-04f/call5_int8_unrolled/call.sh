# stop 41 call 5: the forge-int8 unrolled T=512 row without remat (stop 40's call hit its limit before it)
source devrun/env.sh
PYTHONPATH=. timeout 165 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --timeout 160 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false --implementation auto --layouts unrolled --optimizers forge-int8 --out $OUT/int8 > $OUT/t512_int8.log 2>&1; echo "rc=$?" >> $OUT/t512_int8.log
grep -h "^| llama\|rc=\|^{" $OUT/t512_int8.log | cut -c1-400
kill $SMI
