# stop 40 call 4: where the unrolled T=512 step without remat spends its time, optax against forge-bf16 (--profile)
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 250 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false"
PYTHONPATH=. timeout 480 $M --layouts unrolled --optimizers optax,forge-bf16 --profile --out $OUT/p > $OUT/prof.log 2>&1; echo "rc=$?" >> $OUT/prof.log
grep -v "^{" $OUT/prof.log | grep -iv "warn" | tail -60 | cut -c1-300
kill $SMI
