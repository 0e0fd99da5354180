# Ready-to-run versions of calls 1-2 below (stop 44): stop44_call1.sh (T=512 rows + the autotune_level=0 check), stop44_call2.sh (T=2048 rows, int8 rows).
# Not run yet (stop 43 had no device). First in the next session's device time, before
# ../h200_2026-12-04f/next_session/plan.sh: the fused scanned step without per-block remat,
# new in stop 43 (inplace_scan(remat=False): the forward loop saves each block's matmul and
# attention outputs, the backward loop recomputes no forward matmul). Issue 6's T=512 goal
# (1.2x the optax step) and T=2048 goal (no slower) in the same run as their baselines.
# Two calls (each under the 600 s limit), from the repository root with devrun/env.sh
# (carry devrun; env.sh as ../h200_2026-12-03j/env.sh). What to check in each row: temp
# (the 8B saved residuals should add about 1.5-2.5 GiB at T=512 over scan+remat's 0.39,
# traced on the CPU with XLA attention: experiments/scan_residuals; a temp near a stack of
# weights, ~14 GiB, would mean XLA copied a stack in the backward loop, as jax 0.11.2's CPU
# compile does; jax.checkpoint's prevent_cse barrier avoided that on the CPU), step_lowerings 1, and the losses of the
# scan and scan+remat rows alike (same init and batch).
# Since stop 44 every row is compiled before its state is made (--compile-first): the fused
# rows of stops 15-40 whose temp was below it peaked at the arguments + 1.32 GiB at T=512 and
# + 2.07 GiB at T=2048 whatever their temp (docs/results.md, "Stop 44"), which matches the sizes
# of XLA's autotuner timing the head's forward matmul (its weight, input and two T x V outputs,
# plus 96 MiB) while the state is on the device: a match of sizes, not yet observed. Check: the
# fused rows' "compile peak" (the compile's own now) near 1.32 GiB at T=512 (optax's near its
# head dW matmul's, about 2.18), the forge scan+remat row's live peak near args + temp
# (44.87 + 0.39 = 45.26 GiB, against 46.19 in stops 38 and 40), and its losses and temp as in
# stop 40 (the two compiles may autotune differently). If --compile-first fails on the GPU, drop
# it: the rows then still record compile_peak_bytes (args + the compile's).
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --compiler-options xla_gpu_enable_triton_gemm=false --implementation auto --timeout 170 --compile-first"
PYTHONPATH=. timeout 560 $M --tokens 512 --layouts scan,scan+remat,unrolled --optimizers forge-bf16,optax --out $OUT/t512 > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
kill $SMI
grep -h "^| llama\|rc=\|WARNING" $OUT/*.log | cut -c1-330
# If call 1's fused scan row shows stack copies (temp several GiB above scan+remat's plus the
# residuals), rerun that row with order_writes.patch applied to the device's copy of the tree
# (git apply experiments/results/next_session/order_writes.patch): a barrier over each layer's
# backward outputs (not over slices of the stacks), which made jax 0.11.2's CPU compile copy
# nothing (4-block test model, temp in bytes: scan+remat 7,270,352 -> 2,276,304, scan
# 8,366,416 -> 2,477,136; jax 0.10.2's unchanged: 5,646,480 and 5,859,664); on the GPU it
# may hold a layer's new weights and moments until the layer's backward ends (1.3 GB at 8B).
# Call 2 (T=2048, and int8 moments at T=512), a new call:
# source devrun/env.sh; M=... as above
# PYTHONPATH=. timeout 280 $M --tokens 2048 --layouts scan,unrolled --optimizers forge-bf16,optax --out $OUT/t2048 > $OUT/t2048.log 2>&1
# PYTHONPATH=. timeout 280 $M --tokens 512 --layouts scan --optimizers forge-int8 --out $OUT/t512_int8 > $OUT/t512_int8.log 2>&1
# Call 3 if time is left: the int8 rows at T=2048 with the step's own peak (32.92 GiB in
# stop 38, compiled after the init; 30.85 + 1.54 = 32.39 if stop 44's reading holds), then the
# decisive check of that reading: the fused scan+remat row at T=512 compiled after its init
# (no --compile-first) without autotuning; its live peak should fall to args + temp (45.26):
# PYTHONPATH=. timeout 400 $M --tokens 2048 --layouts scan+remat,unrolled+remat --optimizers forge-int8 --out $OUT/t2048_int8 > $OUT/t2048_int8.log 2>&1
# PYTHONPATH=. timeout 170 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --implementation auto --timeout 160 --compiler-options xla_gpu_enable_triton_gemm=false,xla_gpu_autotune_level=0 --tokens 512 --layouts scan+remat --optimizers forge-bf16 --out $OUT/noautotune > $OUT/noautotune.log 2>&1
# Call 4 if time is left: Qwen3-14B, the middle architecture, last measured on
# 2026-12-01 (61.81 GiB int8 on the Triton kernel, before the slab update and ForgeEmbed):
# PYTHONPATH=. timeout 560 $M --model qwen3-14b --tokens 2048 --layouts scan+remat --optimizers forge-int8,optax --timeout 270 --out $OUT/qwen14 > $OUT/qwen14.log 2>&1
