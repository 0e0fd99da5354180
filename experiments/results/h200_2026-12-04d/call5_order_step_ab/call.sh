# stop 39 call 5: the scanned 8B T=512 step, this tree (group_m=1 for the bf16 MLP/q/o tiles) against f524f4d, alternating.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 120 --tokens 512 --layouts scan+remat --compiler-options xla_gpu_enable_triton_gemm=false --optimizers forge-bf16"
for r in 1 2; do
PYTHONPATH=. timeout 130 $M --out $OUT/head$r > $OUT/step_head$r.log 2>&1; echo "rc=$?" >> $OUT/step_head$r.log
PYTHONPATH=devrun/s39/old:. timeout 130 $M --out $OUT/old$r > $OUT/step_old$r.log 2>&1; echo "rc=$?" >> $OUT/step_old$r.log
done
kill $SMI
for f in $OUT/step_head1.log $OUT/step_old1.log $OUT/step_head2.log $OUT/step_old2.log; do echo $f; grep -h "^| llama\|rc=" $f | cut -c1-330; done
