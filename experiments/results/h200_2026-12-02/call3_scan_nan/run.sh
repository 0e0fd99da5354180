# stop 21 call 3: why the scanned forge-int8 8B step gives a NaN loss
source devrun/env.sh
R=$PWD
sp() {  # dir args...
  d=$1; shift
  (cd $d && PYTHONPATH=$PWD timeout 110 python $R/devrun/scanprobe.py "$@" 2>&1 | grep -E "RESULT|Error" | tail -2 | cut -c1-600) | tee -a $OUT/scanprobe.txt
}
sp $R 32 2048 scan+remat auto int8
sp $R/devrun/alt_old 32 2048 scan+remat auto int8
sp $R/devrun/alt_s19 32 2048 scan+remat auto int8
sp $R 32 2048 scan+remat triton int8
sp $R 32 2048 scan+remat auto bf16
sp $R 2 2048 scan+remat auto int8
