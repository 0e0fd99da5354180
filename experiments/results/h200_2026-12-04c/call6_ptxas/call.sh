# stop 38 call 6: ptxas -v of the default T=512 tile and of 930c55f's staggered layout.
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=devrun/s38/old:. timeout 100 python devrun/s38/ptxas.py > $OUT/ptxas.log 2>&1; echo "rc=$?" >> $OUT/ptxas.log
grep -i "=====\|registers\|spill\|stack\|bytes\|rc=\|Error" $OUT/ptxas.log | head -40
