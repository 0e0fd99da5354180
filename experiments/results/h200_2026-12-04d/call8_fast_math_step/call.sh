# stop 39 call 8: scanned 8B T=512 step with fast-math alone, against neither.
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false PYTHONPATH=.
M="experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 100 --tokens 512 --layouts scan+remat --compiler-options xla_gpu_enable_triton_gemm=false --optimizers forge-bf16"
FORGE_FAST=1 FORGE_PAIR=0 timeout 100 python devrun/s39/flags.py $M --out $OUT/s10 > $OUT/step_10.log 2>&1; echo "rc=$?" >> $OUT/step_10.log
FORGE_FAST=0 FORGE_PAIR=0 timeout 100 python devrun/s39/flags.py $M --out $OUT/s00 > $OUT/step_00.log 2>&1; echo "rc=$?" >> $OUT/step_00.log
grep -h "^| llama\|rc=" $OUT/step_*.log | cut -c1-330
