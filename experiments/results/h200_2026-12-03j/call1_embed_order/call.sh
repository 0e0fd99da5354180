# stop 35 call 1: ForgeEmbed's int8 slabs ordered after the table's pass (no state copies): standalone bench,
# the scanned 8B int8 step under XLA's defaults / slop 1 / latency-hiding scheduler off, and the unrolled int8 step
source devrun/env.sh
mkdir -p $OUT/scan $OUT/unrolled
PYTHONPATH=. timeout 90 python -m experiments.bench_embed_update --moments int8 --reps 10 > $OUT/embed.log 2>&1; echo "rc=$?" >> $OUT/embed.log
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 8 --pipelined 8 --tokens 2048 --optimizers forge-int8"
PYTHONPATH=. timeout 260 python -m experiments.memory_llama $A --layouts scan+remat --out $OUT/scan --timeout 95 --peak-report --compiler-options , --compiler-options xla_gpu_memory_limit_slop_factor=1 --compiler-options xla_gpu_enable_latency_hiding_scheduler=false > $OUT/scan.log 2>&1; echo "rc=$?" >> $OUT/scan.log
PYTHONPATH=. timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --layouts unrolled+remat --out $OUT/unrolled --timeout 200 --peak-report > $OUT/unrolled.log 2>&1; echo "rc=$?" >> $OUT/unrolled.log
tail -12 $OUT/embed.log
for f in $OUT/scan.log $OUT/unrolled.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
