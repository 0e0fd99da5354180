# stop 39 call 6: ncu full set + per-instruction SASS of the T=512 and T=64 default tile (AdamW, bf16 W rounded stochastically).
export PYTHONUNBUFFERED=1 JAX_ENABLE_COMPILATION_CACHE=false
for T in 512 64; do
PYTHONPATH=. timeout 200 ncu --clock-control none --set full -k regex:mosaic -c 1 -o $OUT/rep$T python devrun/s39/sass.py adamw_sr $T > $OUT/ncu$T.log 2>&1; echo "rc=$?" >> $OUT/ncu$T.log
ncu -i $OUT/rep$T.ncu-rep --page details > $OUT/details$T.txt 2>&1
ncu -i $OUT/rep$T.ncu-rep --page source --csv --print-source sass > $OUT/sass$T.csv 2>&1; gzip $OUT/sass$T.csv
ls -la $OUT
done
grep -E "Duration|DRAM Throughput|L2 Hit|Issued Warp|Stall|Eligible" $OUT/details*.txt | head -40
