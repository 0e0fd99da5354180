# stop 21 call 1: which backward order removes the kernel copies without growing the temp?
source devrun/env.sh
R=$PWD
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_ENABLE_COMPILATION_CACHE=false
probe() {  # name dir variant
  rm -rf /tmp/dump_$1
  (cd $2 && XLA_FLAGS="--xla_dump_to=/tmp/dump_$1 --xla_dump_hlo_module_re=jit_step" PYTHONPATH=$PWD \
    timeout 280 python $R/devrun/copyprobe.py llama3.1-8b 32 2048 $3 > $OUT/probe_$1.txt 2>&1
   PYTHONPATH=$R timeout 120 python -m experiments.peak_report /tmp/dump_$1 --top 25 > $OUT/report_$1.txt 2>&1)
}
probe committed $R fwdbar &
probe bwdbar $R fwdbar+bwdbar &
probe postonly $R/devrun/alt_postonly fwdbar &
probe fullorder $R/devrun/alt_fullorder fwdbar &
wait
for n in committed bwdbar postonly fullorder; do echo "== $n"; grep temp $OUT/probe_$n.txt | cut -c1-250; grep -E "^(live at|temp allocation)" $OUT/report_$n.txt; done
best=$(python - <<'PY'
import re, os
out = os.environ["OUT"]; best = None
for n in ("fullorder", "postonly"):
    t = open(f"{out}/probe_{n}.txt").read()
    m = re.search(r"temp ([\d.]+) GiB.*kernel-shaped copies \{\}", t)
    if m and float(m.group(1)) < 3.30 and (best is None or float(m.group(1)) < best[1]):
        best = (n, float(m.group(1)))
print(best[0] if best else "")
PY
)
echo "best: $best"
if [ -n "$best" ]; then
  unset XLA_PYTHON_CLIENT_PREALLOCATE; cd devrun/alt_$best && PYTHONPATH=$PWD timeout 300 python -m experiments.memory_llama --model llama3.1-8b --attention cudnn \
    --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --optimizers forge-int8 \
    --layouts unrolled+remat --peak-report --out $OUT > $OUT/memory_$best.log 2>&1; tail -5 $OUT/memory_$best.log | cut -c1-400
fi
