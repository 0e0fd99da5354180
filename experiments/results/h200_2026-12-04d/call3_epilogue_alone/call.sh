# stop 39 call 3: the epilogue alone (T=64: one token step) against T=512, AdamW and SGD.
source devrun/env.sh
C=m128n128t64s3noT
for r in adamw sgd; do
PYTHONPATH=. timeout 200 python -m experiments.probe_mosaic --shapes 64:4096x14336,512:4096x14336,64:14336x4096,512:14336x4096 --modes bf16,bf16-sr --no-triton --rule $r \
  --configs $C,${C}g1,${C}g4 > $OUT/probe_$r.log 2>&1; echo "rc=$?" >> $OUT/probe_$r.log
done
kill $SMI
grep -h "^##\|rc=" $OUT/probe_*.log
PYTHONPATH=. timeout 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy -k regex:mosaic -c 1 python devrun/s39/sass.py adamw_sr > $OUT/ncu512.txt 2>&1; echo "rc=$?" >> $OUT/ncu512.txt
grep -E "Duration|Throughput|Frequency|Issued|Eligible|Active Warps|Stall|Hit|Bandwidth|Busy|rc=" $OUT/ncu512.txt | head -50
