# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. The T=512 default tile from its own clock (stop 37's call 7 left this open: does SGD's
#    kernel, 1.8-1.9x its floor, spend its time in the token loop or in the W pass, and do a
#    multiprocessor's two CTAs run their token loops at the same time?). About 2 minutes.
source devrun/env.sh
PYTHONPATH=. timeout 240 python -m experiments.trace_mosaic --shapes 512:4096x14336 --modes bf16,bf16-sr --rules sgd,adamw --configs default --dir $OUT/traces > $OUT/trace512.log 2>&1; echo "rc=$?" >> $OUT/trace512.log
kill $SMI
tail -20 $OUT/trace512.log
