# Stop 29, call 1: old vs new AdamW arithmetic (reciprocal bias corrections) and 64x128
# ping-pong tiles; then the kernel's GPU tests at the 8B shapes.
source devrun/env.sh
export PYTHONPATH=.
timeout 230 python devrun/cmp_rule.py 2048:4096x14336 bf16-sr PP_n128s4e32,PP_m64n128s4,PP_m64n128s4e32 2 > $OUT/cmp_2048.log 2>&1
echo "rc=$?" >> $OUT/cmp_2048.log
grep "^\[\|rc=\|WRONG\|ERROR" $OUT/cmp_2048.log
timeout 120 python devrun/cmp_rule.py 512:4096x14336,2048:4096x14336 int8-sr m64n128t64s4 1 > $OUT/cmp_int8.log 2>&1
echo "rc=$?" >> $OUT/cmp_int8.log
grep "^\[\|rc=\|WRONG\|ERROR" $OUT/cmp_int8.log
timeout $(( 585 - SECONDS )) python -m pytest -q tests/test_fused_mosaic.py -k "8b_shapes" > $OUT/pytest_8b.log 2>&1
tail -3 $OUT/pytest_8b.log
kill $SMI
