# stop 36 call 3: where the scanned 8B step's extra time goes at T=512 (forge-bf16 scanned 94.6
# against unrolled 86.4 ms in stop 35): one profiled step each, XLA's defaults and DS on.
source devrun/env.sh
PYTHONPATH=. timeout 280 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 4 --tokens 512 --optimizers forge-bf16,optax --layouts scan+remat --profile --out $OUT --timeout 120 > $OUT/scan512.log 2>&1; echo "rc=$?" >> $OUT/scan512.log
PYTHONPATH=. timeout 150 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 6 --pipelined 4 --tokens 512 --optimizers forge-bf16 --layouts scan+remat --profile --compiler-options xla_gpu_enable_dynamic_slice_fusion=true --out $OUT --timeout 120 > $OUT/scan512_ds.log 2>&1; echo "rc=$?" >> $OUT/scan512_ds.log
kill $SMI
for f in scan512 scan512_ds; do grep -v "^{" $OUT/$f.log | grep -v "^  \|idle before\|^$" | cut -c1-200 | head -150; done
