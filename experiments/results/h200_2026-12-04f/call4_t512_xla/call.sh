# stop 41 call 4: the unrolled T=512 step without remat: ForgeDense with implementation='xla' (XLA's dW, fp32 as the op's reference, and the update in each layer's backward) beside the fused kernels and optax
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --timeout 170 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false"
PYTHONPATH=. timeout 175 $M --implementation xla --layouts unrolled --optimizers forge-bf16 --out $OUT/xla > $OUT/t512_xla.log 2>&1; echo "rc=$?" >> $OUT/t512_xla.log
grep -h "^| llama\|rc=" $OUT/t512_xla.log | cut -c1-330
PYTHONPATH=. timeout $(( 520 - SECONDS )) $M --implementation auto --layouts unrolled --optimizers optax,forge-bf16 --out $OUT/auto > $OUT/t512_auto.log 2>&1; echo "rc=$?" >> $OUT/t512_auto.log
grep -h "^| llama\|rc=" $OUT/t512_auto.log | cut -c1-330
grep -h '"step_ms\|"optimizer"' $OUT/*/*.json 2>/dev/null | head
kill $SMI
