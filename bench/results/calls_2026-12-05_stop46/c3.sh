#!/usr/bin/env bash
# Written at stop 46 for the call after c2.sh (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~120 s): ncu of the FP4
# decode kernel on prepared fold words without a preparer (FINEGEMM_FP4_DECODE_FOLD_CACHE=2) at M = 1 N = 7168
# K = 16384, with per-instruction stall samples, as stop 46's call 1 profiled the default kernel: where the consumers
# wait once the preparer is gone. Summarise the CSV with the region grouping of stop 46's notes (execution counts per
# SASS run; 57344 = 448 CTAs x 4 warps x 32 stages).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
FINEGEMM_FP4_DECODE_FOLD_CACHE=2 timeout 90 ncu --set full --import-source no -k "regex:sm90_fp4_decode_kernel" \
  --launch-skip 4 --launch-count 1 -o $W/ncu_mode2 \
  $B/bench/bench_cuda_linear --m 1 --nk 7168:16384 --variants mxfp4-group128 >$W/ncu_mode2.log 2>&1
echo "-- ncu rc=$? $(el)"
ncu --import $W/ncu_mode2.ncu-rep --page details >$W/ncu_mode2_details.txt 2>&1
ncu --import $W/ncu_mode2.ncu-rep --page source --csv --print-source sass >$W/ncu_mode2_sass.csv 2>$W/ncu_mode2_sass.err
grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|No Eligible|Eligible Warps|Registers Per|Achieved Occupancy|Block Limit|Grid Size|Block Size" $W/ncu_mode2_details.txt | sed 's/  */ /g' | head -24
rm -f $W/ncu_mode2.ncu-rep
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
