source devrun/env.sh
timeout 120 python -m experiments.bench_embed_update > $OUT/bench_embed_update.log 2>&1; tail -7 $OUT/bench_embed_update.log
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --tokens 2048 --implementation auto --out $OUT"
mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" timeout 290 $M --optimizers forge-int8 --layouts unrolled+remat --timeout 285 > $OUT/m8b_T2048_int8_unrolled_embed.log 2>&1
grep "^| llama" $OUT/m8b_T2048_int8_unrolled_embed.log
python devrun/memreport.py /tmp/dump $OUT > $OUT/memreport_embed.txt 2>&1; sed -n 1,16p $OUT/memreport_embed.txt | cut -c1-200
rm -rf /tmp/dump
timeout 170 $M --optimizers forge-int8 --layouts scan+remat --timeout 165 > $OUT/m8b_T2048_int8_scan_embed.log 2>&1
grep "^| llama" $OUT/m8b_T2048_int8_scan_embed.log
