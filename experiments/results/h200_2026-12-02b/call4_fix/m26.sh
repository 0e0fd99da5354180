# stop 22 call 4: the fix (fresh outputs by default, in place where written back; the side barrier) checked on the GPU
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false XLA_PYTHON_CLIENT_PREALLOCATE=false
(timeout 220 python devrun/dsfprobe.py mosaic > /tmp/dsfm.txt 2>&1; echo "rc=$?" >> /tmp/dsfm.txt) &
(timeout 220 python devrun/dsfprobe.py triton > /tmp/dsft.txt 2>&1; echo "rc=$?" >> /tmp/dsft.txt) &
(TAG=fixed timeout 250 python devrun/nanprobe2.py 2 2048 scan+remat auto int8 > /tmp/n2.txt 2>&1; echo "rc=$?" >> /tmp/n2.txt) &
(timeout 280 python -m pytest -q -p no:cacheprovider tests/test_fused_mosaic.py tests/test_forge_dense.py tests/test_llama.py -k "scan_collecting or nn_scan or in_place or ordered or fresh" > /tmp/pt.txt 2>&1; echo "rc=$?" >> /tmp/pt.txt) &
wait
for f in dsfm dsft n2 pt; do echo "== $f"; grep -E "ROW|RESULT|DIFF|Error|rc=|passed|failed|FAILED" /tmp/$f.txt | cut -c1-300 | head -30; done | tee $OUT/m26.txt
unset XLA_PYTHON_CLIENT_PREALLOCATE
python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --steps 4 --tokens 2048 --implementation auto --optimizers forge-int8 --layouts scan+remat --out $OUT/scan_fixed --timeout 200 2>&1 | tail -3
