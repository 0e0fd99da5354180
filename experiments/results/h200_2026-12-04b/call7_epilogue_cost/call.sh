# stop 37 call 7: the T=512 default tile's epilogue cost, same process per rule: SGD and AdamW,
# W rounded to nearest or stochastically (bf16 W; AdamW with bf16 moments), and AdamW fp32.
source devrun/env.sh
for RULE in sgd adamw; do
PYTHONPATH=. timeout 100 python -m experiments.probe_mosaic --rule $RULE --shapes 512:4096x14336,512:14336x4096 --modes bf16,bf16-sr --configs m128n128t64s3noT --no-triton --reps 30 > $OUT/$RULE.log 2>&1; echo "rc=$?" >> $OUT/$RULE.log
done
PYTHONPATH=. timeout 60 python -m experiments.probe_mosaic --rule adamw --shapes 512:4096x14336 --modes fp32 --configs m128n128t64s3noT --no-triton --reps 30 > $OUT/fp32.log 2>&1; echo "rc=$?" >> $OUT/fp32.log
kill $SMI
grep -h "^##\|rc=" $OUT/*.log
