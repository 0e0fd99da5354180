# stop 39 call 7: fast-math (ftz sqrt/rcp) and paired random bits in the epilogue: T=512/64 probes, GPU tests, scanned 8B step.
source devrun/env.sh
export PYTHONPATH=.
for v in 00 10 01 11; do
FORGE_FAST=${v:0:1} FORGE_PAIR=${v:1:1} timeout 60 python devrun/s39/flags.py experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,64:4096x14336 --modes bf16-sr --no-triton --configs m128n128t64s3noT > $OUT/probe_$v.log 2>&1; echo "rc=$?" >> $OUT/probe_$v.log
echo "== $v"; grep -h "^##\|rc=\|WRONG\|ERROR" $OUT/probe_$v.log | cut -c1-200
done
FORGE_FAST=1 FORGE_PAIR=1 timeout 120 python devrun/s39/flags.py pytest -q -x -p no:cacheprovider tests/test_fused_mosaic.py -k "False or ping_pong or warp_specialized" > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log
tail -2 $OUT/tests.log
M="experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --timeout 100 --tokens 512 --layouts scan+remat --compiler-options xla_gpu_enable_triton_gemm=false --optimizers forge-bf16"
FORGE_FAST=1 FORGE_PAIR=1 timeout 100 python devrun/s39/flags.py $M --out $OUT/s11 > $OUT/step_11.log 2>&1; echo "rc=$?" >> $OUT/step_11.log
FORGE_FAST=0 FORGE_PAIR=0 timeout 100 python devrun/s39/flags.py $M --out $OUT/s00 > $OUT/step_00.log 2>&1; echo "rc=$?" >> $OUT/step_00.log
kill $SMI
grep -h "^| llama\|rc=" $OUT/step_*.log | cut -c1-330
