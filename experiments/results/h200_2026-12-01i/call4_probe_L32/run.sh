source devrun/env.sh
timeout 110 python devrun/copyprobe.py llama3.1-8b 32 2048 fwdbar > $OUT/probe_fwdbar.txt 2>&1; grep temp $OUT/probe_fwdbar.txt | cut -c1-300
rm -rf /tmp/dump; mkdir -p /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*step.*" timeout 130 python devrun/copyprobe.py llama3.1-8b 32 2048 fwdbar+bwdbar > $OUT/probe_bwdbar.txt 2>&1; grep temp $OUT/probe_bwdbar.txt | cut -c1-300
timeout 60 python devrun/liverange.py /tmp/dump > $OUT/liverange_bwdbar.txt 2>&1; head -c 5000 $OUT/liverange_bwdbar.txt; sed -n '/grouped/,/estimated/p' $OUT/liverange_bwdbar.txt | head -24
