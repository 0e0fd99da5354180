# the scanned ordered Mosaic NaN: one step ordered vs plain, which leaves differ; XLA flag toggles; dumps. runs in parallel on one GPU
source devrun/env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_ENABLE_COMPILATION_CACHE=false
p() { tag=$1; flags=$2; shift 2; (TAG=$tag XLA_FLAGS="$flags" timeout 200 python devrun/nanprobe2.py "$@" > /tmp/log_$tag.txt 2>&1; echo "rc=$?" >> /tmp/log_$tag.txt) & }
p base "--xla_dump_to=/tmp/dA --xla_dump_hlo_module_re=jit_step --xla_dump_hlo_as_text" 2 2048 scan+remat auto int8
p t512 "" 2 512 scan+remat auto int8
p triton "" 2 2048 scan+remat triton int8
p nocmdbuf "--xla_gpu_enable_command_buffer=" 2 2048 scan+remat auto int8
p nolhs "--xla_gpu_enable_latency_hiding_scheduler=false" 2 2048 scan+remat auto int8
p nodsf "--xla_gpu_enable_dynamic_slice_fusion=false" 2 2048 scan+remat auto int8
p fp32 "" 2 2048 scan+remat auto fp32
p nodbuf "--xla_gpu_enable_while_loop_double_buffering=false" 2 2048 scan+remat auto int8
wait
EMB=unfused TAG=embunf timeout 150 python devrun/nanprobe2.py 1 2048 scan+remat auto bf16 > /tmp/log_l1embunf.txt 2>&1 &
TAG=l1 timeout 150 python devrun/nanprobe2.py 1 2048 scan+remat auto bf16 > /tmp/log_l1.txt 2>&1 &
wait
for f in /tmp/log_*.txt; do echo "== $f"; grep -E "RESULT|DIFF|Error|rc=" $f | head -16 | cut -c1-400; done | tee $OUT/m24.txt
ls /tmp/dA | head -30
cd /tmp/dA && tar czf $OUT/dumpA.tgz $(ls | grep -E "after_optimizations.txt|buffer-assignment") && ls -la $OUT
