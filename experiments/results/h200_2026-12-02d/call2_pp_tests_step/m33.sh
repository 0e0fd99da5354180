# stop 24 call 2: ping-pong GPU tests (every rule), the 8B step with ping-pong (optax vs forge-bf16 vs forge-int8)
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 170 python -m pytest -q -p no:cacheprovider tests/test_fused_mosaic.py -k "ping_pong and not lowers" > $OUT/pytest_pp.txt 2>&1; echo "rc=$?" >> $OUT/pytest_pp.txt)
tail -n 2 $OUT/pytest_pp.txt; grep -E "^FAILED" $OUT/pytest_pp.txt | head
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --tokens 2048 --implementation auto"
$M --optimizers optax,forge-bf16,forge-int8 --layouts unrolled+remat --out $OUT --timeout 200 > $OUT/mem.log 2>&1
grep "^|" $OUT/mem.log | tail -4
