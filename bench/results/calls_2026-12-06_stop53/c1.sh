#!/usr/bin/env bash
# Stop 53, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"]; <= ~300 s), binaries of b454d56: (1) does the
# async-proxy fence wait for the thread's global loads in flight (bench/micro/membar_ldg.cu)? (2) the DeepSeek-V3 FP4
# and FP8 layers at T = 4096 as they stand on this card; (3) ncu's warp-stall samples per SASS instruction of the FP4
# grouped lean kernel (gate_up, T = 4096), to see where its expanding producers wait.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
nvcc -O3 -arch=sm_90a bench/micro/membar_ldg.cu -o $W/membar_ldg && timeout 60 $W/membar_ldg | tee $W/membar.txt
echo "-- membar $(el)"
timeout 120 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe.jsonl 2>$W/moe.err
echo "-- moe rc=$? $(el)"; grep -hE '^\{' $W/moe.jsonl | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print({k: r[k] for k in r if k in ("layer","tokens","recipe","us","tflops","rel_err","ok","path")})'
R=$W/ncu_gu
timeout 200 ncu --clock-control none -k "regex:sm90_fp4_grouped_lean" --launch-skip 0 --launch-count 1 -f -o $R \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
  $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$R.log 2>&1
echo "-- ncu rc=$? $(el)"
ncu -i $R.ncu-rep --page details >$R.txt 2>&1
ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
grep -E "Duration|Warp Cycles Per Issued|Issue Slots|Executed Ipc" $R.txt | head -8
python3 scripts/sass-stalls ${R}_sass.csv --top 45 2>&1 | head -60
rm -f $R.ncu-rep
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
