# stop 41 call 2: ptxas report for the overlapped layout; its wgmmas now left in flight (lag = stages - 2)
source devrun/env.sh
MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=. timeout 100 python -m experiments.probe_mosaic --shapes 512:4096x14336 --modes bf16-sr --no-triton --reps 3 \
  --configs m128n128t64s3noT,OV_n128s4e32noT,OV_n128s5e32noT > $OUT/ptxas.log 2>&1; echo "rc=$?" >> $OUT/ptxas.log
grep -iE "registers|spill|serializ|warning.*wgmma|ms err" $OUT/ptxas.log | grep -v "^0 bytes" | sort | uniq -c | head -30
PYTHONPATH=. timeout 300 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 --modes bf16-sr --no-triton \
  --configs m128n128t64s3noT,OV_n128s4e32noT,OV_n128s5e32noT,OV_n128s4e16noT,OV_n128s4e32x3a2noT,m128n128t64s3noT > $OUT/probe_ov2.log 2>&1; echo "rc=$?" >> $OUT/probe_ov2.log
grep -v Warn $OUT/probe_ov2.log | grep -vi "warnings.warn" | grep -E "ms|rc=" | tail -30
kill $SMI
