# stop 39 call 4: group_m=1 default (bf16 W and states, T<2048) against group_m=8, per op and in the scanned 8B step.
source devrun/env.sh
C=m128n128t64s3noT
PYTHONPATH=. timeout 100 python devrun/s39/bw.py > $OUT/bw.log 2>&1; echo "rc=$?" >> $OUT/bw.log
PYTHONPATH=. timeout 200 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,512:4096x1024,512:4096x128256 --modes bf16-sr --no-triton \
  --configs $C,${C}g1,$C,${C}g1 > $OUT/probe.log 2>&1; echo "rc=$?" >> $OUT/probe.log
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 170 --tokens 512 --layouts scan+remat --compiler-options xla_gpu_enable_triton_gemm=false"
PYTHONPATH=. timeout 200 $M --optimizers optax,forge-bf16 --out $OUT/head > $OUT/step_head.log 2>&1; echo "rc=$?" >> $OUT/step_head.log
PYTHONPATH=devrun/s39/old:. timeout 150 $M --optimizers forge-bf16 --out $OUT/old > $OUT/step_old.log 2>&1; echo "rc=$?" >> $OUT/step_old.log
kill $SMI
cat $OUT/bw.log; grep -h "^##\|rc=" $OUT/probe.log | cut -c1-400; grep -h "^| llama\|rc=" $OUT/step_*.log | cut -c1-330
