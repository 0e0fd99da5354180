source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --tokens 2048 --implementation auto --out $OUT"
rm -rf /tmp/dump; mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" timeout 300 $M --optimizers forge-int8 --layouts unrolled+remat --timeout 295 > $OUT/m8b_int8_unrolled_barrier.log 2>&1
grep "^| llama\|PHASE\|rror" $OUT/m8b_int8_unrolled_barrier.log | tail -3
python devrun/liverange.py /tmp/dump > $OUT/liverange_barrier.txt 2>&1; head -c 4500 $OUT/liverange_barrier.txt
timeout 60 python devrun/hlogrep.py /tmp/dump 8 > $OUT/hlogrep_barrier.txt 2>&1; head -c 3500 $OUT/hlogrep_barrier.txt
rm -rf /tmp/dump
timeout 200 $M --optimizers forge-bf16 --layouts unrolled+remat --timeout 195 > $OUT/m8b_bf16_unrolled_barrier.log 2>&1
grep "^| llama" $OUT/m8b_bf16_unrolled_barrier.log
timeout 150 $M --optimizers optax --layouts unrolled+remat --timeout 145 > $OUT/m8b_optax_unrolled.log 2>&1
grep "^| llama\|PHASE" $OUT/m8b_optax_unrolled.log
