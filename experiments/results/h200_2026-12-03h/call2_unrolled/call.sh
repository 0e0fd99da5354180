# For the next GPU session (not run in stop 32). Copy to devrun/ with
# ../../h200_2026-12-03c/call1_audit/env.sh, put the tree of commit STOP31 (eb807fd: x transposed
# by XLA for the T=2048 bf16 kernel) under devrun/old:
#   mkdir -p devrun/old && git archive eb807fd | tar -x -C devrun/old
# and run with carry ["devrun"]. About 9 device-minutes (next_tests.sh: about 3 more) (a forge unrolled 8B variant takes about
# 150-170 s with --steps 5 --pipelined 4: init ~40, lower ~17, compile ~35, then the steps;
# stop 32's 110-120 s limits were too short).
# Question: does stop 32's kernel default (x through the transposed view at T=2048, bf16) make
# the unrolled fused step no slower than optax at T=2048?
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 4 --layouts unrolled+remat --tokens 2048 --out $OUT"
export PYTHONPATH=.
timeout 200 python -m experiments.memory_llama $A --timeout 190 --optimizers forge-bf16 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && PYTHONPATH=. timeout 200 python -m experiments.memory_llama $A --timeout 190 --optimizers forge-bf16 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
timeout $(( 585 - SECONDS )) python -m experiments.memory_llama $A --timeout 120 --optimizers optax > $OUT/optax.log 2>&1; echo "rc=$?" >> $OUT/optax.log
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
