source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --out $OUT"
rm -rf /tmp/dump; mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" timeout 330 $M --optimizers forge-int8 --layouts unrolled+remat --timeout 325 > $OUT/m8b_int8_unrolled.log 2>&1
grep "^| llama\|PHASE\|rror" $OUT/m8b_int8_unrolled.log | tail -5
python devrun/liverange.py /tmp/dump > $OUT/liverange.txt 2>&1; head -c 9000 $OUT/liverange.txt
f=$(ls /tmp/dump/*jit_step*live-range.txt | tail -1); cp $f $OUT/live_range_full.txt; gzip $OUT/live_range_full.txt
g=$(ls /tmp/dump/*jit_step*after_optimizations.txt | tail -1); cp $g $OUT/step_after_opt.txt; gzip $OUT/step_after_opt.txt
ls -la $OUT
