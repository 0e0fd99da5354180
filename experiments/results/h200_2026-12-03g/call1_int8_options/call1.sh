# Stop 32, call 1: scanned and unrolled Llama-3.1-8B, int8 moments, T=2048, per-block remat:
# memory_analysis temp (and step time) under per-step XLA options (jax.jit compiler_options,
# passed by fj.make_train_step): command buffers off, dynamic-slice fusion on, both.
source devrun/env.sh
export PYTHONPATH=.
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --tokens 2048 --steps 4 --pipelined 2 --out $OUT"
CB=xla_gpu_enable_command_buffer=
DS=xla_gpu_enable_dynamic_slice_fusion=true
timeout 330 python -m experiments.memory_llama $A --timeout 110 --optimizers forge-int8 --layouts scan+remat --peak-report \
  --compiler-options "" --compiler-options "$CB" --compiler-options "$DS" --compiler-options "$CB,$DS" > $OUT/int8_scan.log 2>&1; echo "rc=$?" >> $OUT/int8_scan.log
timeout $(( 590 - SECONDS )) python -m experiments.memory_llama $A --timeout 150 --optimizers forge-int8 --layouts unrolled+remat \
  --compiler-options "$CB" --compiler-options "" > $OUT/int8_unrolled.log 2>&1; echo "rc=$?" >> $OUT/int8_unrolled.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
