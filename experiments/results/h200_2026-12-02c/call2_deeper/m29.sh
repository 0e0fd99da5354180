# stop 23 call 2: ping-pong with deeper rings and epilogues (epi_ahead), fp32 / bf16 / int8
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 100 python -m pytest -q -p no:cacheprovider tests/test_fused_mosaic.py -k "ping_pong or tiles_and_epilogue" > $OUT/pytest_pp.txt 2>&1; echo "rc=$?" >> $OUT/pytest_pp.txt)
tail -n 3 $OUT/pytest_pp.txt; grep -E "^FAILED|Error" $OUT/pytest_pp.txt | head
P="python -m experiments.probe_mosaic --shapes 2048:4096x14336,8192:4096x14336,512:4096x14336 --reps 20"
timeout 170 $P --modes fp32 --configs m128n128t64s3noT,m128n128t64s3x4a3e32noT,PP_n128s4e32,PP_n128s4e16x4a3,PP_n128s5e16 > $OUT/probe_fp32.txt 2>&1
timeout 170 $P --modes bf16 --configs m128n128t64s3noT,PP_n128s4e64,PP_n128s5e32,PP_n128s4e32x4a3 > $OUT/probe_bf16.txt 2>&1
timeout 110 $P --modes int8 --configs m64n128t64s4,PP_m64n128s5 > $OUT/probe_int8.txt 2>&1
for f in fp32 bf16 int8; do grep "^##" $OUT/probe_$f.txt; grep -E "WRONG|ERROR" $OUT/probe_$f.txt | cut -c1-200 | head -5; done
