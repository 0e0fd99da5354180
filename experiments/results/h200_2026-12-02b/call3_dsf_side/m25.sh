# stop 22 call 3: dynamic-slice fusion hazard patterns (small), the 'side' barrier form on the scanned 8B step
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 240 python devrun/dsfprobe.py mosaic > /tmp/dsf.txt 2>&1; echo "rc=$?" >> /tmp/dsf.txt) &
(XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD/devrun/patch:$PWD FORGE_ORDER_FORM=side TAG=side timeout 240 python devrun/nanprobe2.py 2 2048 scan+remat auto int8 > /tmp/side.txt 2>&1; echo "rc=$?" >> /tmp/side.txt) &
wait
grep -E "ROW|Error|rc=" /tmp/dsf.txt | tee $OUT/dsfprobe.txt
grep -E "RESULT|DIFF|Error|rc=" /tmp/side.txt | cut -c1-400 | tee $OUT/side.txt
M="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --optimizers forge-int8"
PYTHONPATH=$PWD/devrun/patch:$PWD FORGE_FORCE_ORDER=1 FORGE_ORDER_FORM=side $M --layouts scan+remat --out $OUT/scan_side --timeout 200 2>&1 | tail -4
PYTHONPATH=$PWD/devrun/patch:$PWD FORGE_ORDER_FORM=side $M --layouts unrolled+remat --out $OUT/unrolled_side --timeout 200 2>&1 | tail -4
$M --layouts scan+remat --out $OUT/scan_plain --timeout 200 2>&1 | tail -4
