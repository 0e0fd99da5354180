# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. Stop 38 found the T=512 tile's two resident CTAs per multiprocessor in step (token loops
#    together 60-79% of the time). Its staggered layout (commit 930c55f: two one-warpgroup
#    tiles per CTA, the second a token loop late) was correct but 2.6-2.9x slower, its epilogue
#    four times as long, with no register spills (call 6's ptxas: 255 registers, 16 barriers).
#    Before another try, check whether its two warpgroups wait for each other inside the
#    epilogue (the 16 barriers; commit 930c55f), e.g. with MOSAIC_GPU_DUMP_PTX=1. This
#    call only re-runs the default tile's trace at the two MLP shapes.
source devrun/env.sh
PYTHONPATH=. timeout 240 python -m experiments.trace_mosaic --shapes 512:4096x14336,512:14336x4096 --modes bf16-sr --rules adamw --configs default --dir $OUT/traces > $OUT/trace512.log 2>&1; echo "rc=$?" >> $OUT/trace512.log
kill $SMI
tail -12 $OUT/trace512.log
