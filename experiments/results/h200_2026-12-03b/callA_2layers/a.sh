# stop 27 call A: is the fused 8B-width model's step the unfused one on the GPU?
source devrun/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 150 python -m pytest -q -x tests/test_fused_mosaic.py -k 8b_shapes -p no:cacheprovider > $OUT/pytest_8b.log 2>&1
echo "pytest rc=$?" >> $OUT/pytest_8b.log; tail -5 $OUT/pytest_8b.log
C="python -m experiments.check_fused_model --model llama3.1-8b --layers 2 --tokens 2048 --steps 2 --attention cudnn"
timeout 240 $C --layout unrolled+remat --variants xla,auto,auto:fresh,mosaic:fresh,triton > $OUT/unrolled.log 2>&1
echo "rc=$?" >> $OUT/unrolled.log
grep -v "1.00[0-9] / 0.0[0-4]" $OUT/unrolled.log | tail -60
timeout $(( 580 - SECONDS )) $C --layout scan+remat --variants xla,auto,auto:fresh > $OUT/scan.log 2>&1
echo "rc=$?" >> $OUT/scan.log
grep -v "1.00[0-9] / 0.0[0-4]" $OUT/scan.log | tail -40
kill $SMI
