# Not run yet (stop 34 had no device time left). The scanned int8 step's temp (goal <= 1.69 GiB,
# committed code 1.77) against XLA's GPU scheduler: stop 34 found every fused update of the
# scanned backward loop scheduled at the loop body's end (call4_hlo_schedule/). Committed code,
# scan+remat T=2048: XLA's defaults, the latency-hiding scheduler off (XLA then picks the
# schedule that needs the least memory among its list/DFS/post-order schedulers), and a 1%
# scheduler memory limit (stop 34: 1.72 GiB int8; a prototype's bf16 step 1.11 at +8% time); int8 with a
# peak report, bf16 for the time. About 6 x 65 s. Run from the repository root with devrun/ carried
# (devrun/env.sh = ../env.sh).
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 8 --pipelined 8 --layouts scan+remat --tokens 2048"
O="--compiler-options , --compiler-options xla_gpu_enable_latency_hiding_scheduler=false --compiler-options xla_gpu_memory_limit_slop_factor=1"
PYTHONPATH=. timeout 300 python -m experiments.memory_llama $A --out $OUT --timeout 95 --peak-report --optimizers forge-int8 $O > $OUT/int8.log 2>&1; echo "rc=$?" >> $OUT/int8.log
PYTHONPATH=. timeout $(( 580 - SECONDS )) python -m experiments.memory_llama $A --out $OUT --timeout 95 --optimizers forge-bf16 --compiler-options , --compiler-options xla_gpu_enable_latency_hiding_scheduler=false > $OUT/bf16.log 2>&1; echo "rc=$?" >> $OUT/bf16.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
