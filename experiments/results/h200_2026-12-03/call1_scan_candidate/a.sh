# stop 26 call A: what the bf16 epilogue costs (ncu + SASS), scanned temp with the no-barrier candidate
source devrun/env.sh
S512=bf16-sr-bf16:512:4096x14336,bf16-rn-bf16:512:4096x14336,fp32:512:4096x14336,bf16-sr-none:512:4096x14336
S2048=bf16-sr-bf16:2048:4096x14336
mkdir -p /tmp/sass
MOSAIC_GPU_DUMP_TO=/tmp/sass MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTXAS=1 timeout 120 python devrun/ncu_one.py $S512,$S2048 > $OUT/sass_run.log 2>&1
echo "sass rc=$?" >> $OUT/sass_run.log
ls -la /tmp/sass | head -30 >> $OUT/sass_run.log
(cd /tmp/sass && tar czf $OUT/sass.tgz .)
timeout 170 ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis -k regex:mosaic -c 10 python devrun/ncu_one.py $S512,$S2048 > $OUT/ncu.txt 2>&1
echo "ncu rc=$?" >> $OUT/ncu.txt
grep -E "ran |Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Executed Instructions  |Compute \(SM\) Th|DRAM Throughput|Warp Cycles Per Issued|rc=" $OUT/ncu.txt | head -80
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --optimizers forge-int8"
timeout $(( 585 - SECONDS )) $M --layouts scan+remat,unrolled+remat --peak-report --timeout 200 --out $OUT > $OUT/scan.log 2>&1
echo "mem rc=$?" >> $OUT/scan.log
kill $SMI
grep "^|\|rc=\|PHASE" $OUT/scan.log | tail -14
