# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. Stop 38 found the T=512 tile's two resident CTAs per multiprocessor in step (token loops
#    together 60-79% of the time). Untried: a CTA of two compute warpgroups that each walk
#    their own tiles through their own stages, the second started half a tile late, so that
#    one's token loop runs under the other's epilogue (unlike ping-pong, whose token loops
#    share one ring and whose 232-register warpgroups spill). It needs kernel work first; this
#    line only re-runs the trace that would show whether the phases stay apart.
source devrun/env.sh
PYTHONPATH=. timeout 240 python -m experiments.trace_mosaic --shapes 512:4096x14336,512:14336x4096 --modes bf16-sr --rules adamw --configs default --dir $OUT/traces > $OUT/trace512.log 2>&1; echo "rc=$?" >> $OUT/trace512.log
kill $SMI
tail -12 $OUT/trace512.log
