# stop 40 call 1: a start delay for the first wave's second CTA per SM (T=512 default tile)
source devrun/env.sh
C=m128n128t64s3noT
timeout 120 python -m pytest -q -x tests/test_fused_mosaic.py -k "start_delay" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
PYTHONPATH=. timeout 300 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096 --modes bf16-sr --no-triton \
  --configs $C,${C}d2,${C}d4,${C}d6,${C}d9,${C}d12,${C}d4o,${C}d6o,${C}d9o,$C > $OUT/probe_delay.log 2>&1; echo "rc=$?" >> $OUT/probe_delay.log
grep -v Warn $OUT/probe_delay.log | grep -E "ms err|##|rc=" 
PYTHONPATH=. timeout 120 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16-sr --rules adamw --configs default,${C}d6,${C}d6o --dir $OUT/traces > $OUT/trace.log 2>&1; echo "rc=$?" >> $OUT/trace.log
grep -v Warn $OUT/trace.log | tail -30
ls $OUT/traces | head; du -sh $OUT/traces
kill $SMI
