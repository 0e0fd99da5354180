# stop 23 call 4: the stochastic-rounding modes, one-warpgroup vs ping-pong, same run
source devrun/env.sh
export JAX_ENABLE_COMPILATION_CACHE=false
P="python -m experiments.probe_mosaic --reps 20"
timeout 60 $P --shapes 2048:4096x14336 --modes bf16-sr,int8-sr --configs m128n128t64s3,PP_n128s4e64,m64n128t64s4,PP_m64n128s5 > $OUT/probe_sr_2048.txt 2>&1
grep "^##" $OUT/probe_sr_2048.txt
timeout 40 $P --shapes 512:4096x14336 --modes int8-sr,bf16-sr --configs m64n128t64s4,PP_m64n128s5,m128n128t64s3noT,PP_n128s4e64 > $OUT/probe_sr_512.txt 2>&1
grep "^##\|^T=" $OUT/probe_sr_512.txt | cut -c1-200
