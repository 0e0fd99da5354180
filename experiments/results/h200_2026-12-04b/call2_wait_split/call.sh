# stop 37 call 2: (a) the last store wait read-only against full, T=512 and 2048 defaults;
# (b) the split-epilogue layout at T=2048 and 8192 against the ping-pong defaults.
source devrun/env.sh
PYTHONPATH=. timeout 300 python devrun/final_wait.py --shapes 512:4096x14336,512:14336x4096,512:4096x4096,2048:4096x14336 --modes bf16-sr --configs m128n128t64s3noT,PP_n128s4e32noT --no-triton --reps 30 > $OUT/final_wait.log 2>&1; echo "rc=$?" >> $OUT/final_wait.log
grep "^read_only\|rc=" $OUT/final_wait.log
PYTHONPATH=. timeout 200 python -m experiments.probe_mosaic --shapes 2048:4096x14336,2048:14336x4096,8192:4096x14336 --modes bf16-sr --configs PP_n128s4e32noT,PP_n128s5e32,SPLIT_s3e32,SPLIT_s3e32noT,SPLIT_s2e64noT --no-triton > $OUT/split_long.log 2>&1; echo "rc=$?" >> $OUT/split_long.log
grep "^##\|rc=\|ERROR\|WRONG" $OUT/split_long.log
kill $SMI
