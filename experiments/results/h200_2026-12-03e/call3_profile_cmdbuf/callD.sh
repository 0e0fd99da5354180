source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --out $OUT --layouts unrolled+remat --profile --steps 4"
timeout 230 $M --timeout 220 --optimizers forge-bf16 > $OUT/prof_forge.log 2>&1; echo "rc=$?" >> $OUT/prof_forge.log
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout 230 $M --timeout 220 --optimizers forge-bf16 > $OUT/prof_forge_nocmdbuf.log 2>&1; echo "rc=$?" >> $OUT/prof_forge_nocmdbuf.log
for f in $OUT/*.log; do echo "== $f"; grep -A12 "^first start\|^| llama" $f | cut -c1-200; grep "rc=" $f; done
kill $SMI
