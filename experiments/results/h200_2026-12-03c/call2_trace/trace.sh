# Stop 28, call 2: where the Mosaic kernel's time goes (on-device profiler), and the same ops timed.
source devrun/env.sh
python -m experiments.trace_mosaic --shapes 2048:4096x14336 --modes bf16-sr --rules adamw,sgd \
  --configs default,PP_n128s3,m128n128t64s3 --dir $OUT/traces > $OUT/trace_2048.log 2>&1
echo "rc=$?" >> $OUT/trace_2048.log
tail -12 $OUT/trace_2048.log
python -m experiments.trace_mosaic --shapes 2048:4096x14336,512:4096x14336 --modes int8-sr --rules adamw \
  --configs default --dir $OUT/traces > $OUT/trace_int8.log 2>&1
echo "rc=$?" >> $OUT/trace_int8.log
tail -6 $OUT/trace_int8.log
timeout 200 python -m experiments.probe_mosaic --shapes 2048:4096x14336 --modes bf16-sr --rule adamw \
  --configs PP_n128s4e64,PP_n128s3,m128n128t64s3 > $OUT/probe.log 2>&1
tail -3 $OUT/probe.log
timeout 100 python -m experiments.probe_mosaic --shapes 2048:4096x14336 --modes bf16-sr --rule sgd \
  --configs PP_n128s4e64 > $OUT/probe_sgd.log 2>&1
tail -2 $OUT/probe_sgd.log
find $OUT/traces -name "*.json" | head -3; du -sh $OUT/traces
kill $SMI
