#!/usr/bin/env bash
# stop 22 call 2: prefill mainloop profile (ncu), FP4 prefill per-kernel times, decode split at the small shapes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/d GPU_CHECK_DEADLINE=150 FP4_DECODE_SHAPES="1:2112:7168 64:2112:7168 1:7168:2048 64:7168:2048 64:7168:16384" FP4_DECODE_CONFIGS="fp8:heuristic fp8:1 fp8:2 fp8:4 fp8:8" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
echo "decode: $(( $(date +%s) - s0 )) s"
for v in mxfp4-group128 block-fp32-dynamic; do
  timeout 90 ncu --metrics gpu__time_duration.sum -c 40 $B/bench/bench_cuda_linear --m 4096 --nk 4096:7168 --variants $v --quick >$W/kernels_$v.txt 2>&1
  echo "== per-kernel $v"; grep -E '^\s+[a-zA-Z_].*\(|gpu__time_duration' $W/kernels_$v.txt | paste - - | awk '{n=$1; print substr(n,1,60), $(NF)}' | head -40
done
echo "kernels: $(( $(date +%s) - s0 )) s"
OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:7168:16384" GPU_CHECK_DEADLINE=$(( 560 - $(date +%s) + s0 )) scripts/gpu-check profile 2>&1 | tail -60
echo "== d"; cat $OUT/d/summary.txt
cd $OUT && tar czf all.tgz d w p && rm -rf d w p
echo "total $(( $(date +%s) - s0 )) s"
