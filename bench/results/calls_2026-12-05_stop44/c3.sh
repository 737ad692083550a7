#!/usr/bin/env bash
# Stop 44, call 3 (stop 43's c3.sh; carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= 560 s, from the repository root):
# Nsight Compute on the decode kernels furthest from their bars, through `gpu-check profile` (warp stalls per SASS
# instruction, scheduler balance, DRAM and L2 rates):
#   FP4 M = 1 N = 7168 K = 16384 (issue 5: FP4 at 0.95x FP8, bar 1.6x; the permuted kernel, with ~30% fewer consumer
#     instructions, was slower, so the bound is not instruction count),
#   E4M3 M = 64 N = 7168 K = 16384 (issue 3: 2.65 TB/s, bar 3.0; is the activation tile's L2 re-read by every 64-row
#     weight tile the limit?), E4M3 M = 1 N = 4096 K = 7168 (2.34 TB/s).
cd "$(dirname "$0")/.."
mkdir -p .snap/.prebuilt && tar xJf .snap/prebuilt.txz -C .snap/.prebuilt; export FINEGEMM_PREBUILT=.snap/.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$W/prof PROFILE_KERNEL='sm90_fp4_decode' \
  PROFILE_SHAPES="1:7168:16384:mxfp4-group128 64:7168:16384:block-fp32-dynamic 1:4096:7168:block-fp32-dynamic" \
  GPU_CHECK_DEADLINE=540 timeout 550 scripts/gpu-check profile >$W/prof.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; grep -E "ncu M=|Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occ|Warp Cycles Per Issued" $W/prof.log | head -40
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
