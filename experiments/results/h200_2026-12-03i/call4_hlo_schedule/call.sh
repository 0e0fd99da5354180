# stop 34 call 4: the compiled scanned int8 step's HLO (after optimizations) and buffer assignment, this tree (late reads + ordering) and stop 33's tree
source devrun/env.sh
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 3 --pipelined 0 --layouts scan+remat --tokens 2048 --optimizers forge-int8"
mkdir -p $OUT/new $OUT/old /tmp/dnew /tmp/dold
XLA_FLAGS="--xla_dump_to=/tmp/dnew --xla_dump_hlo_module_re=jit_step" PYTHONPATH=. timeout 150 python -m experiments.memory_llama $A --out $OUT/new --timeout 140 > $OUT/new.log 2>&1; echo "rc=$?" >> $OUT/new.log
(cd devrun/old && XLA_FLAGS="--xla_dump_to=/tmp/dold --xla_dump_hlo_module_re=jit_step" PYTHONPATH=. timeout 150 python -m experiments.memory_llama $A --out $OUT/old --timeout 140 > $OUT/old.log 2>&1; echo "rc=$?" >> $OUT/old.log)
for d in new old; do
  ls -la /tmp/d$d | head -30 > $OUT/$d/ls.txt
  for f in /tmp/d$d/*jit_step*after_optimizations.txt /tmp/d$d/*jit_step*buffer-assignment.txt /tmp/d$d/*jit_step*live-range*; do [ -f "$f" ] && gzip -c "$f" > $OUT/$d/$(basename $f).gz; done
done
du -sh $OUT/*
for f in $OUT/*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
