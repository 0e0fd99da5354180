# stop 26 call C: is the T=2048 token loop L2-bound? epilogue configurations for bf16 W and states
source devrun/env.sh
export PYTHONPATH=$PWD
timeout 150 ncu --section SpeedOfLight --section WarpStateStats -k regex:mosaic -c 2 python devrun/ncu_one.py bf16-sr-bf16:512:4096x14336,bf16-sr-bf16:2048:4096x14336 once > $OUT/ncu.txt 2>&1
echo "ncu rc=$?" >> $OUT/ncu.txt
grep -E "Duration|Throughput|Stall|rc=" $OUT/ncu.txt | head -60
P="timeout 200 python -m experiments.probe_mosaic --reps 20 --modes bf16-sr"
$P --shapes 512:4096x14336 --configs m128n128t64s3,m128n128t64s3E,m128n128t64s3e128,m128n128t64s3e128E,m128n128t64s3x3,m128n128t64s3x4a3,m128n128t64s3x4a4,m64n128t64s2,m64n128t64s4e128,m64n128t64s4 > $OUT/p512.log 2>&1
echo "rc=$?" >> $OUT/p512.log
$P --shapes 2048:4096x14336 --configs PP_n128s4e64,PP_n128s4a1,PP_n128s2x3,PP_n128s2x3a3,PP_n128s3x3,PP_n128s3,m128n128t64s3E,m128n128t64s3e128 > $OUT/p2048.log 2>&1
echo "rc=$?" >> $OUT/p2048.log
timeout 100 python -m experiments.probe_mosaic --reps 20 --modes bf16-sr,fp32 --rule sgd --shapes 2048:4096x14336,512:4096x14336 --configs PP_n128s4e64,m128n128t64s3 > $OUT/psgd.log 2>&1
echo "rc=$?" >> $OUT/psgd.log
kill $SMI
grep -h "^##\|rc=" $OUT/p512.log $OUT/p2048.log $OUT/psgd.log | cut -c1-600
