# stop 25 call C: wait for the table started in call B, then the 8B step with the new k/v default
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
while [ $SECONDS -lt 420 ] && ! grep -q "^rc=" /tmp/bench/bench.log; do sleep 5; done
cp /tmp/bench/bench.log $OUT/bench.log; cp /tmp/bench/*.json $OUT/ 2>/dev/null
echo "rows: $(grep -c '^{"shape"' $OUT/bench.log) after ${SECONDS}s"; grep "^rc=\|^timing" $OUT/bench.log
if grep -q "^rc=" /tmp/bench/bench.log && [ $SECONDS -lt 420 ]; then
  timeout $(( 540 - SECONDS )) python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --tokens 2048 --implementation auto --optimizers forge-bf16 --layouts unrolled+remat --profile --timeout 150 --out $OUT > $OUT/prof2.log 2>&1
  grep "^|" $OUT/prof2.log | head -12
fi
