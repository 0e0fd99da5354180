# stop 25 call B: chain vs call at T=8192 (HLO + both barriers), 5120->1024 probe, then the full table (background, runs on into call C)
source devrun/env.sh
PYTHONPATH=. timeout 120 python devrun/chainprobe.py 8192 4096 14336 > $OUT/chainprobe.log 2>&1
grep "^==\|^##" $OUT/chainprobe.log; echo "copy lines: $(grep -c ' copy(\|copy-start\|copy_fusion\|transpose' $OUT/chainprobe.log)"
B=$(python - <<'PY'
import re
import os
l=[x for x in open(os.environ['OUT'] + '/chainprobe.log') if x.startswith('## ')]
d=dict((k.strip(), float(v)) for k, v in (re.match(r'(.*) ([0-9.]+)$', p.strip()).groups() for p in l[0][3:].split('|'))) if l else {}
ok=all(k in d for k in ('xla chain3 barrier=state','xla chain3 barrier=all','mosaic chain3 barrier=state','mosaic chain3 barrier=all'))
print('state' if ok and d['xla chain3 barrier=state'] < 0.97*d['xla chain3 barrier=all'] and d['mosaic chain3 barrier=state'] < 0.97*d['mosaic chain3 barrier=all'] else 'all')
PY
)
echo "barrier for the table: $B" | tee $OUT/barrier.txt
timeout 100 python -m experiments.probe_mosaic --shapes 2048:5120x1024,8192:5120x1024 --modes fp32,bf16-sr --configs m128n128t64s3noT,PP_n128s4e64,PP_n128s5e16,PP_n128s3e32noT --reps 20 > $OUT/probe5120.log 2>&1
grep "^##" $OUT/probe5120.log | cut -c1-300
mkdir -p /tmp/bench
setsid nohup bash -c "python -m experiments.bench_fused_dw --shapes models --rules adamw --modes fp32,bf16-sr-bf16,int8 --mosaic --no-triton --torch --reps 30 --chain 3 --barrier $B --out /tmp/bench > /tmp/bench/bench.log 2>&1; echo rc=\$? >> /tmp/bench/bench.log" > /dev/null 2>&1 < /dev/null &
while [ $SECONDS -lt 575 ] && ! grep -q "^rc=" /tmp/bench/bench.log; do sleep 5; done
cp /tmp/bench/bench.log $OUT/bench_partial.log
echo "rows so far: $(grep -c '^{"shape"' /tmp/bench/bench.log)"; tail -c 600 /tmp/bench/bench.log
