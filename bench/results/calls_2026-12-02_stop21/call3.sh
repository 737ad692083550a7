#!/usr/bin/env bash
# stop 21 call 3: FP4 prefill expansion with the device-side fold choice (tile / row / FP4 kernel): tests, memcheck,
# FP4 against FP8 at the prefill shapes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$(mktemp -d)
OUT=$OUT/t GPU_CHECK_DEADLINE=240 TESTS="test_cuda_fp4 test_cuda_linear test_cuda_edge" scripts/gpu-check test >/dev/null 2>&1 &
( for v in mxfp4-group128:520:1152 mxfp4-group32:520:1056; do IFS=: read -r var n k <<<"$v"
    FINEGEMM_FP4_EXPAND_M=1 FINEGEMM_FP4_DECODE=0 timeout 100 compute-sanitizer --tool memcheck $B/bench/bench_cuda_linear --m 200 --nk $n:$k --variants $var >$W/memcheck_$var.txt 2>&1
    echo "memcheck $v rc=$? $(grep 'ERROR SUMMARY' $W/memcheck_$var.txt | head -2) :: $(grep -o '"rel_err": [-0-9.e]*' $W/memcheck_$var.txt | tr '\n' ' ')" >>$W/memcheck.sum; done ) &
wait
cat $W/memcheck.sum
echo "correctness: $(( $(date +%s) - s0 )) s"
el=$(( $(date +%s) - s0 ))
OUT=$OUT/b GPU_CHECK_DEADLINE=$(( 440 - el )) FP4_SHAPES="4096:7168:16384 4096:4096:7168 4096:24576:1536 4096:2112:7168 4096:7168:2048 512:7168:16384" \
  FP4_VARIANTS="block-fp32-dynamic mxfp4-group128 mxfp4-group32" scripts/gpu-check bench-fp4 >/dev/null 2>&1
for d in t b; do echo "== $d"; cat $OUT/$d/summary.txt; done
cp $W/memcheck_*.txt $OUT/t/ 2>/dev/null
cd $OUT && tar czf all.tgz t b && rm -rf t b
echo "total $(( $(date +%s) - s0 )) s"
