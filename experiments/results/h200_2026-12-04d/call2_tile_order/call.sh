# stop 39 call 2: T=512 default tile against other tile orders (group_m) and a 64x256 tile.
source devrun/env.sh
C=m128n128t64s3noT
PYTHONPATH=. timeout 420 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096 --modes bf16-sr --no-triton \
  --configs $C,${C}g1,${C}g2,${C}g4,${C}g16,${C}g32,m64n256t64s2noT,$C > $OUT/probe_order.log 2>&1; echo "rc=$?" >> $OUT/probe_order.log
kill $SMI
grep -v Warn $OUT/probe_order.log | tail -30
