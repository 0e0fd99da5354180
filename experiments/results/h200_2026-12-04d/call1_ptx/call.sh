# stop 39 call 1: SASS of the default T=512 tile.
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
TB=$(python -c "import triton,os;print(os.path.join(os.path.dirname(triton.__file__),'backends/nvidia/bin'))")
ls $TB > $OUT/tritonbin.txt; which nvdisasm cuobjdump ptxas >> $OUT/tritonbin.txt 2>&1
for v in adamw_sr adamw_near sgd_near; do
  mkdir -p $OUT/$v
  MOSAIC_GPU_DUMP_SASS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_TO=$OUT/$v PYTHONPATH=. timeout 120 python devrun/s39/sass.py $v > $OUT/$v.log 2>&1; echo "rc=$?" >> $OUT/$v.log
  ls -la $OUT/$v | head
  for p in $OUT/$v/*.ptx; do [ -f "$p" ] && $TB/ptxas -arch=sm_90a -o $OUT/$v/k.cubin "$p" && $TB/nvdisasm -c $OUT/$v/k.cubin > $OUT/$v/k_nvdisasm.sass 2>&1; done
  ls -la $OUT/$v | head -20
done
tail -3 $OUT/*.log
