source devrun/env.sh
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --tokens 2048 --implementation auto --out $OUT"
mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" timeout 300 $M --optimizers forge-int8 --layouts unrolled+remat --timeout 295 > $OUT/m8b_T2048_int8_unrolled.log 2>&1
grep "^| llama\|^PHASE" $OUT/m8b_T2048_int8_unrolled.log
python devrun/memreport.py /tmp/dump $OUT > $OUT/memreport.txt 2>&1; head -c 5000 $OUT/memreport.txt
rm -rf /tmp/dump
timeout 250 $M --optimizers forge-bf16 --layouts unrolled+remat --timeout 245 > $OUT/m8b_T2048_bf16_unrolled.log 2>&1
grep "^| llama" $OUT/m8b_T2048_bf16_unrolled.log
ls $OUT
