source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --out $OUT"
# C: the scanned int8 step, stack slices read once (old) or again in the backward (new)
for r in 0 1; do
  FORGE_JAX_RESLICE=$r timeout 150 $M --timeout 140 --steps 4 --optimizers forge-int8 --layouts scan+remat --peak-report > $OUT/scan_int8_reslice$r.log 2>&1; echo "rc=$?" >> $OUT/scan_int8_reslice$r.log
done
# B: where the unrolled bf16 step waits (gaps between kernels), command buffers on and off
timeout 125 $M --timeout 120 --steps 4 --optimizers forge-bf16 --layouts unrolled+remat --profile > $OUT/prof_forge.log 2>&1; echo "rc=$?" >> $OUT/prof_forge.log
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout 125 $M --timeout 120 --steps 4 --optimizers forge-bf16 --layouts unrolled+remat --profile > $OUT/prof_forge_nocmdbuf.log 2>&1; echo "rc=$?" >> $OUT/prof_forge_nocmdbuf.log
for f in $OUT/*.log; do echo "== $f"; grep -A10 "^first start\|^| llama" $f | cut -c1-220; grep "rc=\|Error" $f | tail -3; done
kill $SMI
