# Stop 28, call 4: scalars read per sub-tile (before) / per tile / per warpgroup, then the 8B step table.
source devrun/env.sh
timeout 200 python -m experiments.trace_mosaic --shapes 2048:4096x14336 --modes bf16-sr --rules adamw \
  --configs default --scalars-at sub,tile,kernel --dir $OUT/tr > $OUT/pp.log 2>&1
echo "rc=$?" >> $OUT/pp.log; grep -A12 "^| shape" $OUT/pp.log; grep ERROR $OUT/pp.log | cut -c1-300
timeout 120 python -m experiments.trace_mosaic --shapes 2048:4096x14336,512:4096x14336 --modes int8-sr,bf16-sr --rules adamw \
  --configs default --scalars-at sub,kernel --dir $OUT/tr > $OUT/onewg.log 2>&1
echo "rc=$?" >> $OUT/onewg.log; grep -A12 "^| shape" $OUT/onewg.log; grep ERROR $OUT/onewg.log | cut -c1-300
rm -rf $OUT/tr
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 6 --implementation auto --timeout 120 --out $OUT"
timeout $(( 585 - SECONDS )) $M --tokens 512,2048 --optimizers optax,forge-bf16 --layouts scan+remat > $OUT/table.log 2>&1
echo "rc=$?" >> $OUT/table.log
kill $SMI
grep "^| llama\|rc=" $OUT/table.log
