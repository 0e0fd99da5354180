# For the next GPU session (not run in stop 27). In the full-depth scanned 8B step:
# 1. does each Mosaic update match the reference ON ITS OWN INPUTS? (fused_step(audit=True))
# 2. with XLA's excess precision off (its fusions then keep every bf16 rounding), does the
#    Mosaic step come closer to the reference? (Mosaic's default tile at T=2048 takes x
#    transposed by XLA, a different program around the kernel than Triton's.)
source devrun/env.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
C="python -m experiments.check_fused_model --model llama3.1-8b --layers 0 --tokens 2048 --attention cudnn --leaves params --steps 1 --layout scan+remat"
timeout 150 $C --variants xla,auto --audit > $OUT/audit.log 2>&1
echo "rc=$?" >> $OUT/audit.log
grep -c "forge audit" $OUT/audit.log
grep "forge audit" $OUT/audit.log | sort -t' ' -k5 -g | tail -8
grep "loss per\|rc=" $OUT/audit.log
grep "layers\[3[01]\]/\|layers\[0\]/\|lm_head\|embed" $OUT/audit.log | grep "^| "
XLA_FLAGS=--xla_allow_excess_precision=false timeout 200 $C --variants xla,auto,triton > $OUT/noexcess.log 2>&1
echo "rc=$?" >> $OUT/noexcess.log
grep "loss per\|verdict" $OUT/noexcess.log
grep "layers\[3[01]\]/\|layers\[0\]/\|lm_head\|embed" $OUT/noexcess.log | grep "^| "
kill $SMI
