# stop 36 call 1: T=512. (a) per-op sweep of one-warpgroup tiles with early epilogue loads
# and 2 stages (two CTAs per SM), bf16 W rounded stochastically, bf16 moments, the 8B shapes;
# (b) the unrolled 8B step at T=512, optax and forge-bf16, one profiled step each.
source devrun/env.sh
CFG=m128n128t64s3noT,m128n128t64s2noT,m128n128t64s2Ee32noT,m128n128t64s2Ee32x3noT,m128n128t64s2Ee32x4a3noT,m128n128t64s2EnoT,m128n128t64s3x3noT,m128n128t64s3x4a3e32noT
PYTHONPATH=. timeout 260 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,512:4096x1024,512:4096x128256 --modes bf16-sr --configs $CFG --no-triton > $OUT/probe.log 2>&1; echo "rc=$?" >> $OUT/probe.log
grep "^##\|rc=" $OUT/probe.log
PYTHONPATH=. timeout 300 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 4 --tokens 512 --optimizers optax,forge-bf16 --layouts unrolled+remat --profile --out $OUT --timeout 140 > $OUT/t512.log 2>&1; echo "rc=$?" >> $OUT/t512.log
kill $SMI
grep -v "^{" $OUT/t512.log | cut -c1-250 | tail -120
