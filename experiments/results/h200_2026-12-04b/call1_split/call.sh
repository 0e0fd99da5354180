# stop 37 call 1: the split-epilogue layout. (a) its GPU tests; (b) T=512 per-op sweep against
# the default one-warpgroup tile, bf16 W rounded stochastically, bf16 moments, the 8B shapes.
source devrun/env.sh
PYTHONPATH=. timeout 200 python -m pytest -q -x tests/test_fused_mosaic.py -k split > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log
tail -15 $OUT/tests.log
CFG=m128n128t64s3noT,SPLIT_s3e32,SPLIT_s3e32noT,SPLIT_s2e32noT,SPLIT_s3e16noT,SPLIT_s2e64noT,SPLIT_s2e32x3noT
PYTHONPATH=. timeout 300 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,512:4096x1024 --modes bf16-sr --configs $CFG --no-triton > $OUT/probe.log 2>&1; echo "rc=$?" >> $OUT/probe.log
grep "^##\|rc=\|rror" $OUT/probe.log | head -30
kill $SMI
