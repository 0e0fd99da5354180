# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. Per op against the unfused step that optax runs (the matmul gives dW in bf16), the
#    baseline stop 40 estimated near its floors in the 8B model (probe_mosaic now times it as
#    xla-bf16dW), at the 8B shapes, T=512 and 2048.
# 3. The unrolled T=512 step without remat with ForgeDense's implementation='xla' (XLA's dW
#    and the same update inside each layer's backward): is it optax's time, as at T=2048 with
#    remat (stop 25)? And the forge-int8 rows without remat (stop 40's call hit its limit).
source devrun/env.sh
PYTHONPATH=. timeout 200 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 \
  --modes bf16-sr --no-triton --configs m128n128t64s3noT > $OUT/probe_bf16dw.log 2>&1
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --timeout 200 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false"
# (a) the pair with the fused kernels, (b) ForgeDense with XLA's dW and update in each layer's
# backward (unrolled, and scanned where inplace_scan still writes layer by layer); the same call.
PYTHONPATH=. timeout 200 $M --implementation auto --layouts unrolled --optimizers optax,forge-bf16 --out $OUT/auto > $OUT/t512_auto.log 2>&1
PYTHONPATH=. timeout 200 $M --implementation xla --layouts unrolled,scan+remat --optimizers forge-bf16 --out $OUT/xla > $OUT/t512_xla.log 2>&1
kill $SMI
grep -h "##\|^| llama" $OUT/*.log | cut -c1-330
