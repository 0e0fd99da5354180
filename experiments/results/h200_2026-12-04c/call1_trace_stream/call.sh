# stop 38 call 1: T=512 tile trace (per multiprocessor), stream-overlap micro, 8B scanned T=512 with updates on stream 1.
source devrun/env.sh
PYTHONPATH=. timeout 200 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16,bf16-sr --rules sgd,adamw --configs default --dir $OUT/traces > $OUT/trace512.log 2>&1; echo "rc=$?" >> $OUT/trace512.log
PYTHONPATH=. timeout 120 python devrun/s38/stream_micro.py > $OUT/stream_micro.log 2>&1; echo "rc=$?" >> $OUT/stream_micro.log
tail -12 $OUT/stream_micro.log
for S in "" 1; do
FORGE_JAX_UPDATE_STREAM=$S PYTHONPATH=. timeout 150 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 130 --tokens 512 --layouts scan+remat --optimizers forge-bf16 --compiler-options xla_gpu_enable_triton_gemm=false --out $OUT/step_s$S > $OUT/step_s$S.log 2>&1; echo "rc=$?" >> $OUT/step_s$S.log
grep -h "^| llama\|rc=\|Error\|error" $OUT/step_s$S.log | cut -c1-330
done
kill $SMI
tail -16 $OUT/trace512.log
