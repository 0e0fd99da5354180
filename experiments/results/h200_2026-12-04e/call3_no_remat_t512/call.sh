# stop 40 call 3: the rows without per-block remat at T=512, beside scan+remat, one run
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 200 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false"
PYTHONPATH=. timeout 400 $M --layouts scan,scan+remat,unrolled --optimizers optax,forge-bf16 --out $OUT/a > $OUT/t512a.log 2>&1; echo "rc=$?" >> $OUT/t512a.log
grep -h "^| llama\|rc=" $OUT/t512a.log | cut -c1-330
PYTHONPATH=. timeout 170 $M --layouts scan,unrolled --optimizers forge-int8 --out $OUT/b > $OUT/t512b.log 2>&1; echo "rc=$?" >> $OUT/t512b.log
grep -h "^| llama\|rc=" $OUT/t512b.log | cut -c1-330
kill $SMI
