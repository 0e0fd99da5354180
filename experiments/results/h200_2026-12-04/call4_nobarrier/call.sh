# stop 36 call 4: the scanned step's 480 memcpy128 (14.3 ms at T=512, call 3): the stacked
# kernels' slices for the matmuls. Without the matmul barrier for stacked layers (devrun/nobar:
# commit f927188 with dense._matmul's optimization_barrier skipped for stacked paths), and with
# XLA options that let a cuBLAS gemm read a dynamic slice in place.
source devrun/env.sh
ML="python -m experiments.memory_llama --model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 5 --pipelined 3 --tokens 512 --layouts scan+remat --profile --timeout 100"
F=xla_gpu_enable_dynamic_slice_fusion=true,xla_gpu_enable_cublaslt=false,xla_gpu_enable_triton_gemm=false
(cd devrun/nobar && PYTHONPATH=. timeout 250 $ML --optimizers forge-bf16 --compiler-options "" --compiler-options xla_gpu_enable_dynamic_slice_fusion=true --compiler-options $F --out $OUT/nobar > $OUT/nobar.log 2>&1; echo "rc=$?" >> $OUT/nobar.log)
PYTHONPATH=. timeout 150 $ML --optimizers forge-bf16,optax --compiler-options $F --out $OUT/cur > $OUT/cur.log 2>&1; echo "rc=$?" >> $OUT/cur.log
kill $SMI
for f in nobar cur; do grep "^| llama\|rc=\|step .* ms wall\|memcpy128\|^| copy\|^| fused\|^| matmul\|^| XLA fusion\|Error\|error" $OUT/$f.log | cut -c1-260; done
