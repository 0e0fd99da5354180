# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. The forge-int8 unrolled T=512 row without remat, with room for its ~120 s of init,
#    lowering and compiling (stop 41's call gave it 160 s in all and it timed out in its steps).
# 3. bench_fused_dw --unfused-grad-dtype bfloat16 (not yet run on the GPU), at the 8B shapes.
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false --implementation auto"
PYTHONPATH=. timeout 290 $M --timeout 280 --layouts unrolled --optimizers forge-int8 --out $OUT/int8 > $OUT/t512_int8.log 2>&1; echo "rc=$?" >> $OUT/t512_int8.log
PYTHONPATH=. timeout 240 python -m experiments.bench_fused_dw --unfused-grad-dtype bfloat16 --mosaic --no-triton --rules adamw --modes bf16-sr --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 > $OUT/bench_bf16dw.log 2>&1; echo "rc=$?" >> $OUT/bench_bf16dw.log
kill $SMI
grep -h "^| llama\|rc=" $OUT/*.log | cut -c1-330
