source devrun/env.sh
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
timeout 280 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --out $OUT --layouts unrolled+remat --steps 6 --timeout 135 --optimizers optax,forge-bf16 > $OUT/nocmdbuf.log 2>&1; echo "rc=$?" >> $OUT/nocmdbuf.log
grep "^| llama\|rc=" $OUT/nocmdbuf.log | cut -c1-250
kill $SMI
