#!/usr/bin/env bash
# Next session's second call (a warm follow-up of next_call1.sh; carry [".snap"]): Nsight Compute on the default
# prefill kernel at M = 4096 N = 7168 K = 16384 (192x128 in B-sharing 2-CTA pairs since stop 24), with and without
# promotion: where the consumer's ~1475 cycles per K block go now that the feed allows ~1320 TFLOP/s.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s)
mkdir -p $OUT/p $OUT/q
FINEGEMM_GEMM_WIDE_STORES=1 FINEGEMM_GEMM_CONFIG=192x128:1c2 OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:7168:16384" GPU_CHECK_DEADLINE=200 scripts/gpu-check profile 2>&1 | tail -60
cd $OUT && tar czf all.tgz p q 2>/dev/null; rm -rf p q
echo "total $(( $(date +%s) - s0 )) s"
