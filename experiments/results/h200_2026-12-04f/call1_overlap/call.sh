# stop 41 call 1: the overlapped layout (each compute warpgroup's next token loop beside its previous epilogue)
source devrun/env.sh
MOSAIC_GPU_DUMP_PTXAS=1 timeout 170 python -m pytest -q -x tests/test_fused_mosaic.py -k "overlap and not lowers and not refusals" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -4 $OUT/pytest.log; grep -ciE "spill|serializ" $OUT/pytest.log; grep -iE "bytes spill|serializ" $OUT/pytest.log | sort | uniq -c | head -12
PYTHONPATH=. timeout 330 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 --modes bf16-sr --no-triton \
  --configs m128n128t64s3noT,PP_n128s4e32noT,OV_n128s4e32,OV_n128s4e32noT,OV_n128s3e32noT,OV_n128s5e32noT,OV_n128s4e16noT,OV_n128s4e64noT,m128n128t64s3noT > $OUT/probe_ov.log 2>&1; echo "rc=$?" >> $OUT/probe_ov.log
grep -v Warn $OUT/probe_ov.log | grep -vi "warnings.warn" | tail -40
kill $SMI
