# Not run yet. For the next session's device time, from the repository root with devrun/env.sh.
# 1. If nvidia-h200-x2 is lent: ../../h200_2026-12-03h/next_session/tp2.sh (TP=2, issue 6).
# 2. Stop 39 found the T=512 kernel's distance to its floor in the epilogue itself (T=64:
#    1.33-1.49x the byte floor; ~52 SASS instructions per weight; warps waiting on TMA
#    barriers; 16-byte spill; ncu: 361 MB sent to the L2 compression unit, 0% compressed).
#    Leads, none tried yet:
#    a. whether XLA's buffers are allocated compressible (ncu's "L2 Compression" section on
#       XLA's own AdamW fusion over the same arrays, below): if XLA's fusion shows the same,
#       the cost is shared by the baseline;
#    b. the epilogue's loads in flight with fewer registers (the spill) and the sub-tile
#       order (stop 26/36 sweeps varied slots and widths, not the spill);
#    c. fewer integer instructions in stochastic rounding that the compiler keeps per pair
#       (stop 39's PAIRED_BITS, commit 778ea9a, was slower: presumably the hash stayed per
#       element; its SASS was not read).
#    This call only profiles XLA's own passes over one 4096x14336 W and its moments (call 4's
#    bw.py: a read and write of the three arrays, then an AdamW update; the first fusions).
source devrun/env.sh
PYTHONPATH=. timeout 200 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:fusion -c 8 python experiments/results/h200_2026-12-04d/call4_order_step/bw.py > $OUT/ncu_xla_update.txt 2>&1
kill $SMI
grep -E "Duration|DRAM Throughput|Compression|Memory Throughput" $OUT/ncu_xla_update.txt
