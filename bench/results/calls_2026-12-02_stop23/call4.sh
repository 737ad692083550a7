#!/usr/bin/env bash
# stop 23 call 4 (short): why 2-CTA clusters are slow: bench 128x128 vs 128x128:1c2, and a profile of the cluster kernel.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
for cfg in 128x128 128x128:1c2; do
  FINEGEMM_GEMM_CONFIG=$cfg FINEGEMM_PRINT_CONFIG=1 timeout 30 $B/bench/bench_cuda_linear --m 4096 --nk 4096:7168 >$W/cfg_$cfg.txt 2>&1
  echo "cfg $cfg :: $(grep -o 'fit at once[^)]*\|-> [^ ]*' $W/cfg_$cfg.txt | head -2 | tr '\n' ' ') $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*' $W/cfg_$cfg.txt | head -2 | tr '\n' ' ')"
done
FINEGEMM_GEMM_CONFIG=128x128:1c2 OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:4096:7168" GPU_CHECK_DEADLINE=75 scripts/gpu-check profile 2>&1 | grep -E "stalled_(wait|long|barrier|dispatch|gmma|selected)|Duration|Throughput|Warp Cycles" | head -14
cd $OUT && tar czf all.tgz w p && rm -rf w p
echo "total $(( $(date +%s) - s0 )) s"
