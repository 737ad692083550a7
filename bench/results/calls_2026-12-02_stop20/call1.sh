#!/usr/bin/env bash
# stop 20 call 1: tests + sanitizers at once, then the decode split-K cluster bench.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s)
OUT=$OUT/t GPU_CHECK_DEADLINE=330 TESTS="test_cuda_linear test_cuda_fp4 test_cuda_moe test_cuda_edge test_cuda_moe_routing" scripts/gpu-check test >/dev/null 2>&1 &
OUT=$OUT/s GPU_CHECK_DEADLINE=330 scripts/gpu-check sanitize >/dev/null 2>&1 &
wait
el=$(( $(date +%s) - s0 ))
echo "correctness phase: $el s"
OUT=$OUT/b GPU_CHECK_DEADLINE=$(( 565 - el )) FP4_DECODE_SHAPES="1:7168:16384 64:7168:16384 1:4096:7168 64:4096:7168 1:24576:1536 64:24576:1536" \
  FP4_DECODE_CONFIGS="fp8:heuristic fp8c:heuristic k128:heuristic k128c:heuristic" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
for d in t s b; do echo "== $d"; cat $OUT/$d/summary.txt; done
