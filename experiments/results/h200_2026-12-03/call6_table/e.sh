# stop 26 call E: the scanned model's head ordered (default order_updates=None now orders unstacked layers); 8B T=2048 table
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --timeout 200 --peak-report --out $OUT"
$M --optimizers forge-int8,forge-bf16 --layouts scan+remat,unrolled+remat > $OUT/forge.log 2>&1
echo "forge rc=$?" >> $OUT/forge.log
grep "^| llama\|rc=" $OUT/forge.log
timeout $(( 590 - SECONDS )) $M --optimizers optax --layouts unrolled+remat > $OUT/optax.log 2>&1
echo "optax rc=$?" >> $OUT/optax.log
kill $SMI
grep -h "^| llama\|rc=" $OUT/optax.log
grep -h "^RESULT" $OUT/forge.log $OUT/optax.log | python3 -c "
import sys,json
for l in sys.stdin:
  r=json.loads(l[7:]); print(r['optimizer'], r['layout'], round(r['temp_size_in_bytes']/2**30,3), round(r['peak_bytes']/2**30,3), round(r['step_s']*1e3,1), r['loss'])"
