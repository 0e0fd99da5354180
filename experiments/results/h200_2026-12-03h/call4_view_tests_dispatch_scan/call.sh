# (1) GPU tests of the transposed-view kernels after plgpu.transpose_ref -> ref.transpose
# (jax 0.11 deprecates transpose_ref); (2) host cost per step of the state's tree;
# (3) scanned T=2048 bf16: forge with stop 32's kernel default against optax, 20+20 steps.
source devrun/env.sh
export PYTHONPATH=.
timeout 150 python -m pytest -q tests/test_fused_mosaic.py -k "noT or unit-8b-gate-up or unit-8b-k-v" -W "error:jax.experimental.pallas.mosaic_gpu.transpose_ref is deprecated:DeprecationWarning" > $OUT/pytest.log 2>&1; echo "rc=$?" >> $OUT/pytest.log
tail -4 $OUT/pytest.log
timeout 90 python -m experiments.state_dispatch --model llama3.1-8b --steps 200 > $OUT/state_dispatch.log 2>&1; echo "rc=$?" >> $OUT/state_dispatch.log
tail -13 $OUT/state_dispatch.log
A="--model llama3.1-8b --attention cudnn --logits-dtype bfloat16 --implementation auto --steps 20 --pipelined 20 --layouts scan+remat --tokens 2048 --out $OUT"
timeout 140 python -m experiments.memory_llama $A --timeout 130 --optimizers forge-bf16 > $OUT/scan_forge.log 2>&1; echo "rc=$?" >> $OUT/scan_forge.log
timeout $(( 580 - SECONDS )) python -m experiments.memory_llama $A --timeout 120 --optimizers optax > $OUT/scan_optax.log 2>&1; echo "rc=$?" >> $OUT/scan_optax.log
for f in $OUT/scan*.log; do echo "== $f"; grep "^| llama\|rc=\|^  llama" $f | cut -c1-330; done
kill $SMI
