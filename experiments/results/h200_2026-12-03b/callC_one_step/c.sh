# stop 27 call C: full-depth Llama-3.1-8B scanned, ONE step: each kernel vs the XLA reference vs a rounding-seed control; then the 8B-shape kernel tests with dW near eps
source devrun/env.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
C="python -m experiments.check_fused_model --model llama3.1-8b --layers 0 --tokens 2048 --attention cudnn --leaves params"
timeout 330 $C --steps 1 --layout scan+remat --variants xla,auto,triton,xla:seed1 > $OUT/scan1.log 2>&1
echo "rc=$?" >> $OUT/scan1.log
grep -v Warn $OUT/scan1.log | tail -22
timeout $(( 520 - SECONDS )) python -m pytest -q tests/test_fused_mosaic.py -k "8b_shapes and near-eps" -p no:cacheprovider > $OUT/pytest_eps.log 2>&1
echo "pytest rc=$?" >> $OUT/pytest_eps.log; tail -4 $OUT/pytest_eps.log
kill $SMI
