#!/usr/bin/env bash
# stop 21 call 2: FP4 prefill through expanded weights: test_cuda_fp4 + test_cuda_linear + test_cuda_edge, memcheck of
# the expansion, then FP4 against FP8 at prefill sizes (expanded, in-kernel), the M threshold, and the MoE at T = 4096.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$(mktemp -d)
OUT=$OUT/t GPU_CHECK_DEADLINE=240 TESTS="test_cuda_fp4 test_cuda_linear test_cuda_edge" scripts/gpu-check test >/dev/null 2>&1 &
( FINEGEMM_FP4_EXPAND_M=1 FINEGEMM_FP4_DECODE=0 timeout 120 compute-sanitizer --tool memcheck $B/bench/bench_cuda_linear --m 200 --nk 520:1056 --variants mxfp4-group128,mxfp4-group32 >$W/memcheck.txt 2>&1; echo "memcheck rc=$? $(grep 'ERROR SUMMARY' $W/memcheck.txt | head -2) :: $(grep -o '"rel_err": [-0-9.e]*' $W/memcheck.txt | tr '\n' ' ')" >$W/memcheck.sum ) &
wait
cat $W/memcheck.sum
echo "correctness: $(( $(date +%s) - s0 )) s"
el=$(( $(date +%s) - s0 ))
OUT=$OUT/b GPU_CHECK_DEADLINE=$(( 500 - el )) FP4_SHAPES="4096:7168:16384 4096:4096:7168 4096:24576:1536 4096:2112:7168 4096:7168:2048 256:7168:16384 512:7168:16384 128:7168:16384" \
  FP4_VARIANTS="block-fp32-dynamic mxfp4-group128 mxfp4-group128:inkernel mxfp4-group32 mxfp4-group32:inkernel" scripts/gpu-check bench-fp4 >/dev/null 2>&1
el=$(( $(date +%s) - s0 ))
[ $el -lt 520 ] && timeout $(( 585 - el )) $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 8 >$W/moe.jsonl 2>&1
grep -o '"variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*"\|"layer_us[a-z_]*": [0-9.]*\|"gemm_tflops": [0-9.]*' $W/moe.jsonl | tr '\n' ' '; echo
for d in t b; do echo "== $d"; cat $OUT/$d/summary.txt; done
cp $W/memcheck.txt $W/moe.jsonl $OUT/t/ 2>/dev/null
cd $OUT && tar czf all.tgz t b && rm -rf t b
echo "total $(( $(date +%s) - s0 )) s"
