# stop 23 call 3: ping-pong defaults — tests, bench_fused_dw (auto's Mosaic default), the 8B step (optax vs forge-bf16)
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 python -m pytest -q -p no:cacheprovider tests/test_fused_mosaic.py -k "ping_pong and not lowers" > $OUT/pytest_pp.txt 2>&1; echo "rc=$?" >> $OUT/pytest_pp.txt)
tail -n 2 $OUT/pytest_pp.txt; grep -E "^FAILED" $OUT/pytest_pp.txt | head
timeout 200 python -m experiments.bench_fused_dw --shapes 512:4096x14336,2048:4096x14336,8192:4096x14336 --rules adamw --modes fp32,bf16-sr-bf16,int8 --mosaic --reps 20 --out $OUT/bench > $OUT/bench.txt 2>&1
grep "^|" $OUT/bench.txt | tail -12
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto"
$M --optimizers optax,forge-bf16 --layouts unrolled+remat --out $OUT/mem --timeout 100 2>&1 | grep "^|" | tail -3
