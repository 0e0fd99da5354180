# stop 40 call 5: the unrolled T=2048 rows without per-block remat, optax against forge-bf16, one run
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 200 --tokens 2048 --compiler-options xla_gpu_enable_triton_gemm=false"
PYTHONPATH=. timeout 330 $M --layouts unrolled --optimizers optax,forge-bf16 --out $OUT/a > $OUT/t2048.log 2>&1; echo "rc=$?" >> $OUT/t2048.log
grep -h "^| llama\|rc=" $OUT/t2048.log | cut -c1-330
kill $SMI
