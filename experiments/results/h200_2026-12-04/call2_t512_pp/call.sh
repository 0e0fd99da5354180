# stop 36 call 2: T=512, bf16 W rounded stochastically, bf16 moments: the one-warpgroup
# default against ping-pong and cooperative tiles (x through the transposed view), 8B shapes.
source devrun/env.sh
CFG=m128n128t64s3noT,PP_n128s4e32noT,PP_n128s3e32noT,PP_n128s2e32noT,PP_n128s4e64noT,PP_n128s4e32x3noT,PP_n128s2e32x4a3noT,WS_n128s3e32noT
PYTHONPATH=. timeout 330 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,512:4096x1024 --modes bf16-sr --configs $CFG --no-triton > $OUT/probe.log 2>&1; echo "rc=$?" >> $OUT/probe.log
PYTHONPATH=. timeout 120 python -m experiments.probe_mosaic --shapes 512:4096x128256 --modes bf16-sr --configs m128n128t64s3noT,PP_n128s4e32noT,PP_n128s3e32noT --no-triton --reps 10 > $OUT/probe_head.log 2>&1; echo "rc=$?" >> $OUT/probe_head.log
kill $SMI
grep "^##\|rc=\|WRONG\|ERROR" $OUT/probe.log $OUT/probe_head.log | cut -c1-600
