source devrun/env.sh
timeout 200 python devrun/copyprobe.py llama3.1-8b 4 2048 fwdbar,nofwdbar,nofwdbar+bwdbar,fwdbar+bwdbar > $OUT/copyprobe_L4.txt 2>&1; grep -v Warning $OUT/copyprobe_L4.txt | cut -c1-600 | tail -40
timeout 300 python devrun/copyprobe.py llama3.1-8b 32 2048 fwdbar+bwdbar,nofwdbar+bwdbar > $OUT/copyprobe_L32.txt 2>&1; grep "temp" $OUT/copyprobe_L32.txt | cut -c1-400
