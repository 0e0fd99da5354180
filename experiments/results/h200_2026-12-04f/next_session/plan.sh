# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 0. First (stop 43): ../../next_session/scan_saved.sh, the fused scan without per-block remat.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. The one-warpgroup overlap layout (MosaicConfig(overlap=True), stop 41, tested only in the
#    CPU interpreter and lowered for CUDA): its compiled tests, ptxas's report (registers,
#    spills, C7514) and the probe at the 8B shapes against the default tile and XLA's
#    bf16-dW pair. If a variant is faster, the scanned+remat T=512 step with it as the
#    default (stop 38 did the same for its staggered tile by changing MosaicConfig.default).
# 3. The forge-int8 unrolled T=512 row without remat, with room for its ~120 s of init,
#    lowering and compiling (stop 41's call gave it 160 s in all and it timed out in its steps,
#    presumably compiling the step a second time there: stop 42 found that the jitted step's
#    first call re-lowered it in unrolled and TP rows, and memory_llama now runs the executable
#    it compiled; each row's step_lowerings should read 1).
# Stops 42–45 (2026-12-04/05): no device machine was lent; this plan was not run.
# Stop 44: the memory_llama row compiles its step before making its state (--compile-first), so
# its live peak is the steps' own (docs/results.md, "Stop 44").
source devrun/env.sh
timeout 150 python -m pytest -q -x tests/test_fused_mosaic.py -k "overlap" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=. timeout 90 python -m experiments.probe_mosaic --shapes 512:4096x14336 --modes bf16-sr --no-triton --reps 3 \
  --configs OV_m64n128s2e32noT,OV_m128n128s3e32noT > $OUT/ptxas.log 2>&1; echo "rc=$?" >> $OUT/ptxas.log
grep -iE "C7514|used [0-9]+ registers|spill stores|ms err" $OUT/ptxas.log | sort | uniq -c
PYTHONPATH=. timeout 300 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 --modes bf16-sr --no-triton \
  --configs m128n128t64s3noT,OV_m64n128s2e32noT,OV_m64n128s2e16noT,OV_m64n64s3e32noT,OV_m64n128s3e32noT,OV_m128n128s3e32noT,OV_m128n128s4e32noT > $OUT/probe_ov.log 2>&1; echo "rc=$?" >> $OUT/probe_ov.log
grep -E "ms err|baseline|^##|rc=" $OUT/probe_ov.log | sed 's/ (compile.*//'
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --pipelined 3 --tokens 512 --compiler-options xla_gpu_enable_triton_gemm=false --implementation auto --compile-first"
PYTHONPATH=. timeout 290 $M --timeout 280 --layouts unrolled --optimizers forge-int8 --out $OUT/int8 > $OUT/t512_int8.log 2>&1; echo "rc=$?" >> $OUT/t512_int8.log
kill $SMI
grep -h "^| llama\|rc=" $OUT/*.log | cut -c1-330
