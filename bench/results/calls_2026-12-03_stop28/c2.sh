#!/usr/bin/env bash
# Stop 28 call 2: where FP4 decode's time goes (ncu with source counters, M = 1 N = 7168 K = 16384 mxfp4-group128),
# FP4 against FP8 (decode, prefill, the expansion's crossover M), then the slow GPU tests not reached at stops 26-27
# (test_cuda_fp4 whole, AllRecipes and ClustersOfFourAcrossTiles of test_cuda_linear), two binaries at once.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
PROFILE_KERNEL=sm90_fp4_decode PROFILE_SHAPES=1:7168:16384:mxfp4-group128 \
FP4_SHAPES="1:7168:16384 16:7168:16384 64:7168:16384 128:7168:16384 256:7168:16384 1024:7168:16384 4096:7168:16384" \
FP4_VARIANTS="block-fp32-dynamic mxfp4-group128 mxfp4-group128:expand mxfp4-group128:inkernel" \
GPU_CHECK_DEADLINE=270 OUT=$W/gc scripts/gpu-check profile bench-fp4 > $W/gc.txt 2>&1
echo "gpu-check rc=$? ($(( $(date +%s) - s0 )) s)"; grep -v "^ *$" $W/gc.txt | tail -45
t() {  # binary timeout filter tag
  timeout $2 $B/tests/$1 ${3:+--gtest_filter=$3} >$W/$1$4.txt 2>&1
  echo "$1 $3 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $W/$1$4.txt | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' $W/$1$4.txt | head; grep -A4 Failure $W/$1$4.txt | head -20
}
left=$(( 575 - $(date +%s) + s0 ))
t test_cuda_fp4 $left '' _all > $W/o1 &
t test_cuda_linear $left '*AllRecipes*:*ClustersOfFour*' _slow > $W/o2 &
wait; cat $W/o1 $W/o2
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
