# stop 27 call D: is the Mosaic step's difference a race (auto twice; command buffers off) and does it show unrolled?
source devrun/env.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
C="python -m experiments.check_fused_model --model llama3.1-8b --tokens 2048 --attention cudnn --leaves params --steps 1"
timeout 130 $C --layers 0 --layout scan+remat --variants xla,auto,auto,mosaic:fresh > $OUT/twice.log 2>&1
echo "rc=$?" >> $OUT/twice.log; grep -v Warn $OUT/twice.log | tail -16
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 110 $C --layers 0 --layout scan+remat --variants xla,auto > $OUT/nocmdbuf.log 2>&1
echo "rc=$?" >> $OUT/nocmdbuf.log; grep -v Warn $OUT/nocmdbuf.log | tail -13
timeout $(( 375 - SECONDS )) $C --layers 4 --layout unrolled+remat --variants xla,auto,triton > $OUT/unrolled4.log 2>&1
echo "rc=$?" >> $OUT/unrolled4.log; grep -v "Warn\|layers_[123]" $OUT/unrolled4.log | tail -16
kill $SMI
