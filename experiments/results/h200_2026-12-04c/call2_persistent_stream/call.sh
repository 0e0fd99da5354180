# stop 38 call 2: persistent one-warpgroup tile (GPU tests, probe at T=512 and 2048, trace); stream micro and 8B step with updates on stream 1.
source devrun/env.sh
PYTHONPATH=. timeout 150 python -m pytest -q -x tests/test_fused_mosaic.py -k "persistent" > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
C=m128n128t64s3noT,m128n128t64s3noTP,m128n128t64s3noTP1,m128n128t64s2e32noT,m128n128t64s2e32noTP,m128n128t64s2e32noTP3
PYTHONPATH=. timeout 200 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096,512:4096x1024 --modes bf16-sr --no-triton --configs $C > $OUT/probe512.log 2>&1; echo "rc=$?" >> $OUT/probe512.log
tail -12 $OUT/probe512.log
PYTHONPATH=. timeout 100 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16-sr --rules adamw --configs m128n128t64s3noT,m128n128t64s3noTP --space 64 --dir $OUT/traces > $OUT/trace.log 2>&1; echo "rc=$?" >> $OUT/trace.log
tail -9 $OUT/trace.log
PYTHONPATH=. timeout 90 python devrun/s38/stream_micro.py > $OUT/stream_micro.log 2>&1; echo "rc=$?" >> $OUT/stream_micro.log
grep -v "^    @" $OUT/stream_micro.log | tail -9
FORGE_JAX_UPDATE_STREAM=1 PYTHONPATH=. timeout 130 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 120 --tokens 512 --layouts scan+remat --optimizers forge-bf16 --compiler-options xla_gpu_enable_triton_gemm=false --out $OUT/step_s1 > $OUT/step_s1.log 2>&1; echo "rc=$?" >> $OUT/step_s1.log
grep -h "^| llama\|rc=" $OUT/step_s1.log | cut -c1-330
kill $SMI
