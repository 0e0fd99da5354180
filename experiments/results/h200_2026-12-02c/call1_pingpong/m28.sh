# stop 23 call 1: ping-pong kernel (tests, then tile probe), GPU tests of stop 22's fix, the committed scanned step
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python -m pytest -q -p no:cacheprovider tests/test_fused_mosaic.py -k "ping_pong or warp_specialized" > $OUT/pytest_pp.txt 2>&1; echo "rc=$?" >> $OUT/pytest_pp.txt) &
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 python -m pytest -q -p no:cacheprovider tests/test_llama.py tests/test_fused_mosaic.py tests/test_forge_dense.py -k "nn_scan or scan_collecting or ordered or only_unstacked" > $OUT/pytest_fix.txt 2>&1; echo "rc=$?" >> $OUT/pytest_fix.txt) &
wait
tail -4 $OUT/pytest_pp.txt $OUT/pytest_fix.txt
grep -E "FAILED|Error" $OUT/pytest_pp.txt | head -20
timeout 290 python -m experiments.probe_mosaic --shapes 2048:4096x14336,512:4096x14336,8192:4096x14336 --modes fp32,int8 --configs m128n128t64s3,m128n128t64s3noT,m64n128t64s4,PP_n128s3e32,PP_n128s3e32noT,PP_n128s4e16,PP_n128s3,PP_m64n128s4,PP_m64n256s3e32 --reps 20 > $OUT/probe.txt 2>&1
grep -v "^T=" $OUT/probe.txt | tail -12; grep -E "WRONG|ERROR" $OUT/probe.txt | cut -c1-250 | head
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto"
$M --optimizers forge-int8 --layouts scan+remat --out $OUT/scan --timeout 130 2>&1 | tail -3
