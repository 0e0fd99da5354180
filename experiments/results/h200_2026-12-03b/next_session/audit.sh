# stop 27 call E: in the full-depth scanned 8B step, does each Mosaic update match the reference ON ITS OWN INPUTS? (fused_step audit)
source devrun/env.sh
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
timeout 120 python -m experiments.check_fused_model --model llama3.1-8b --layers 0 --tokens 2048 --attention cudnn --leaves params --steps 1 --layout scan+remat --variants xla,auto --audit > $OUT/audit.log 2>&1
echo "rc=$?" >> $OUT/audit.log
grep -c "forge audit" $OUT/audit.log
grep "forge audit" $OUT/audit.log | sort -t' ' -k5 -g | tail -8
grep "loss per\|rc=" $OUT/audit.log
kill $SMI
