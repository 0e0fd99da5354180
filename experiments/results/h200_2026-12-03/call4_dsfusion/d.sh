# stop 26 call D: scanned temp with XLA's dynamic-slice fusion, with and without the no-barrier candidate
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --optimizers forge-int8 --timeout 200 --peak-report"
mkdir -p $OUT/a $OUT/b
XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $M --layouts scan+remat --out $OUT/a > $OUT/a/log 2>&1
echo "a rc=$?" >> $OUT/a/log
patch -R -p1 < devrun/cand.patch && grep -c "spec.stacked" forge_jax/_src/dense.py
XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $M --layouts scan+remat --out $OUT/b > $OUT/b/log 2>&1
echo "b rc=$?" >> $OUT/b/log
kill $SMI
grep -h "^| llama\|rc=" $OUT/a/log $OUT/b/log
grep -h "^RESULT" $OUT/a/log $OUT/b/log | python3 -c "
import sys,json
for l in sys.stdin:
  r=json.loads(l[7:]); print(r['temp_size_in_bytes']/2**30, r['peak_bytes']/2**30, r['step_s'], r['loss'])"
