# stop 38 call 5: the staggered layout (two one-warpgroup tiles per CTA, the second a token loop late): GPU tests, T=512 probe, trace, 8B scanned T=512 step with it as the default.
source devrun/env.sh
PYTHONPATH=. timeout 90 python -m pytest -q -x tests/test_fused_mosaic.py -k "staggered" > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
C=m128n128t64s3noT,ST_n128s3noT,ST_n128s3e32noT,ST_n128s2noT
PYTHONPATH=. timeout 120 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096 --modes bf16-sr --no-triton --configs $C > $OUT/probe512.log 2>&1; echo "rc=$?" >> $OUT/probe512.log
grep "^##\|ERROR\|rc=" $OUT/probe512.log | cut -c1-400
PYTHONPATH=. timeout 70 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16-sr --rules adamw --configs ST_n128s3noT --space 40 --dir $OUT/traces > $OUT/trace.log 2>&1; echo "rc=$?" >> $OUT/trace.log
grep "^|\|ERROR\|rc=" $OUT/trace.log | cut -c1-300
FORGE_JAX_STAGGERED=1 PYTHONPATH=. timeout 110 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 100 --tokens 512 --layouts scan+remat --optimizers forge-bf16 --compiler-options xla_gpu_enable_triton_gemm=false --out $OUT/step > $OUT/step.log 2>&1; echo "rc=$?" >> $OUT/step.log
grep -h "^| llama\|rc=" $OUT/step.log | cut -c1-330
kill $SMI
