# Stop 28, call 5: ping-pong sub-tile widths with the scalars read per tile; the 8B step unrolled at T=512.
source devrun/env.sh
timeout 110 python -m experiments.trace_mosaic --shapes 2048:4096x14336 --modes bf16-sr --rules adamw \
  --configs default,PP_n128s4e32,PP_n128s4e16 --scalars-at tile,sub --dir $OUT/tr > $OUT/pp.log 2>&1
echo "rc=$?" >> $OUT/pp.log; grep -A12 "^| shape" $OUT/pp.log; grep ERROR $OUT/pp.log | cut -c1-300
rm -rf $OUT/tr
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --timeout 150 --out $OUT"
timeout $(( 330 - SECONDS )) $M --tokens 512 --optimizers optax,forge-bf16 --layouts unrolled+remat > $OUT/table.log 2>&1
echo "rc=$?" >> $OUT/table.log
kill $SMI
grep "^| llama\|rc=" $OUT/table.log
