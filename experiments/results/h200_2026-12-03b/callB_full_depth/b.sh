# stop 27 call B: full-depth Llama-3.1-8B, fused kernels vs the XLA reference vs a rounding-seed control
source devrun/env.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
C="python -m experiments.check_fused_model --model llama3.1-8b --layers 0 --tokens 2048 --steps 4 --attention cudnn --leaves params"
timeout 300 $C --layout scan+remat --variants xla,auto,xla:seed1 > $OUT/scan.log 2>&1
echo "rc=$?" >> $OUT/scan.log
grep -v "^| params/layers" $OUT/scan.log | tail -30
timeout $(( 585 - SECONDS )) $C --layout unrolled+remat --variants xla,auto > $OUT/unrolled.log 2>&1
echo "rc=$?" >> $OUT/unrolled.log
grep -v "^| params/layers_[12]" $OUT/unrolled.log | tail -40
kill $SMI
