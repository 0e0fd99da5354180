# stop 41 call 3: the overlapped layout with the previous tile's gradient staged in shared memory
source devrun/env.sh
MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=. timeout 90 python -m experiments.probe_mosaic --shapes 512:4096x14336 --modes bf16-sr --no-triton --reps 3 \
  --configs OV_n128s3e32noT,OV_n128s4e16noT > $OUT/ptxas.log 2>&1; echo "rc=$?" >> $OUT/ptxas.log
grep -iE "C7514|used [0-9]+ registers|spill stores|ms err" $OUT/ptxas.log | sort | uniq -c | head -20
PYTHONPATH=. timeout 260 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 --modes bf16-sr --no-triton \
  --configs m128n128t64s3noT,OV_n128s3e32,OV_n128s3e32noT,OV_n128s4e16noT,OV_n128s3e16noT,OV_n128s2e64noT > $OUT/probe_ov3.log 2>&1; echo "rc=$?" >> $OUT/probe_ov3.log
grep -E "^##|rc=" $OUT/probe_ov3.log
timeout 100 python -m pytest -q -x tests/test_fused_mosaic.py -k "overlap and not lowers and not refusals and (adamw-bf16 or stochastic)" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
kill $SMI
