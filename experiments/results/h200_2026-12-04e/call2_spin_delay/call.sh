# stop 40 call 2: the start delay as a spin on %globaltimer (call 1's nanosleep left no mark)
source devrun/env.sh
C=m128n128t64s3noT
timeout 120 python -m pytest -q -x tests/test_fused_mosaic.py -k "start_delay" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -3 $OUT/pytest.log
PYTHONPATH=. timeout 150 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16-sr --rules adamw --configs default,${C}d6,${C}d6o,${C}d12 --dir $OUT/traces > $OUT/trace.log 2>&1; echo "rc=$?" >> $OUT/trace.log
grep -v Warn $OUT/trace.log | grep -v warnings.warn | tail -16
PYTHONPATH=. timeout 300 python -m experiments.probe_mosaic --shapes 512:4096x14336,512:14336x4096,512:4096x4096 --modes bf16-sr --no-triton \
  --configs $C,${C}d2,${C}d4,${C}d6,${C}d9,${C}d12,${C}d4o,${C}d6o,${C}d9o,$C > $OUT/probe_delay.log 2>&1; echo "rc=$?" >> $OUT/probe_delay.log
grep -v Warn $OUT/probe_delay.log | grep -E "##|rc="
kill $SMI
