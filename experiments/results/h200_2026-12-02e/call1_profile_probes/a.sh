# stop 25 call A: the 8B step's device time by kernel kind (optax vs forge-bf16), out=1024 tile probes, chain vs call at T=8192
source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 5 --tokens 2048 --implementation auto"
$M --optimizers optax,forge-bf16 --layouts unrolled+remat --profile --timeout 150 --out $OUT > $OUT/prof.log 2>&1
echo "mem rc=$?" >> $OUT/prof.log
grep "^|" $OUT/prof.log | tail -3
timeout 170 python -m experiments.probe_mosaic --shapes 512:4096x1024,2048:4096x1024,8192:5120x1024 --modes fp32,bf16-sr --configs m128n128t64s3,m128n128t64s3noT,m64n128t64s4,m64n128t64s4x3,m64n64t64s4,PP_m64n128s4 --reps 20 > $OUT/probe1024.log 2>&1
echo "probe rc=$?" >> $OUT/probe1024.log
(timeout 50 python -m experiments.probe_mosaic --shapes 8192:4096x14336 --configs PP_n128s5e16 --reps 20 --chain 0; timeout 50 python -m experiments.probe_mosaic --shapes 8192:4096x14336 --configs PP_n128s5e16 --reps 20 --chain 3) > $OUT/probe8192.log 2>&1
kill $SMI
grep "^##\|rc=" $OUT/probe1024.log $OUT/probe8192.log | cut -c1-400
