# stop 26 call B: what the bf16 epilogue costs (ncu + SASS)
source devrun/env.sh
export PYTHONPATH=$PWD
S512=bf16-sr-bf16:512:4096x14336,bf16-rn-bf16:512:4096x14336,fp32:512:4096x14336,bf16-sr-none:512:4096x14336
S2048=bf16-sr-bf16:2048:4096x14336
mkdir -p /tmp/sass
MOSAIC_GPU_DUMP_TO=/tmp/sass MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 timeout 120 python devrun/ncu_one.py $S512,$S2048 > $OUT/sass_run.log 2>&1
echo "sass rc=$?" >> $OUT/sass_run.log
ls -la /tmp/sass | head -30 >> $OUT/sass_run.log
(cd /tmp/sass && tar czf $OUT/sass.tgz .)
timeout 200 ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis -k regex:mosaic -c 10 python devrun/ncu_one.py $S512,$S2048 > $OUT/ncu.txt 2>&1
echo "ncu rc=$?" >> $OUT/ncu.txt
kill $SMI
grep -E "ran |Duration|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Executed Instructions  |Compute \(SM\) Th|DRAM Throughput|Warp Cycles Per Issued|rc=" $OUT/ncu.txt | head -80
