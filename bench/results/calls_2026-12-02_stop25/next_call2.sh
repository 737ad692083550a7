#!/usr/bin/env bash
# Next session's second call (a warm follow-up of next_call1.sh; carry [".snap"]): Nsight Compute on the two worst
# bar shapes of stop 25. M = 4096 N = 7168 K = 16384 with the 2x2 clusters (FINEGEMM_GEMM_CONFIG=192x128:1c4; change
# it to the winner of next_call1.sh), and M = 128 N = 32768 K = 512 (0.70x cuBLASLt: 13.4 vs 9.4 us; 128x128 tiles,
# two waves of four K blocks each, where the weights and output alone need ~6 us at 4 TB/s; 128x256 tiles, one
# wave, measured 34 us, which also wants explaining).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s)
mkdir -p $OUT/p $OUT/q $OUT/r
FINEGEMM_GEMM_CONFIG=192x128:1c4 OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:7168:16384" GPU_CHECK_DEADLINE=150 scripts/gpu-check profile 2>&1 | tail -40
OUT=$OUT/q PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="128:32768:512" GPU_CHECK_DEADLINE=120 scripts/gpu-check profile 2>&1 | tail -40
FINEGEMM_GEMM_CONFIG=128x256 OUT=$OUT/r PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="128:32768:512" GPU_CHECK_DEADLINE=120 scripts/gpu-check profile 2>&1 | tail -25
cd $OUT && tar czf all.tgz p q r 2>/dev/null; rm -rf p q r
echo "total $(( $(date +%s) - s0 )) s"
