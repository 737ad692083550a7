#!/usr/bin/env bash
# Stop 58, call 7 (the budget's last ~300 s; LIMIT=<timeout_s>): c6.sh cut down. The grouped lean tests with the new
# default, one A/B at DeepSeek-V3 T = 4096 (default, =0, default), then initcheck of GroupedLeanSameBits for what is left.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-170}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 40 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-16s T=%-5d %-22s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*' >$W/test_lean.txt 2>&1
echo "-- test_cuda_moe *GroupedLean* rc=$? $(el): $(grep -c '^\[       OK' $W/test_lean.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test_lean.txt | head -3 | tr '\n' ' ')"
grep -B2 -A6 "Failure" $W/test_lean.txt | head -20
one new_1 deepseek-v3 4096 dynamic X=1
one l0 deepseek-v3 4096 dynamic FINEGEMM_GROUPED_LEAN=0
one new_2 deepseek-v3 4096 dynamic X=1
if left $(( LIMIT - 40 )); then
  timeout $(( LIMIT - 10 - ($(date +%s) - s0) )) compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
  echo "-- initcheck GroupedLeanSameBits rc=$? $(el)"; grep -E "ERROR SUMMARY|Uninitialized|at .*cuh:[0-9]+|PASSED|FAILED" $W/initcheck.txt | sort | uniq -c | sort -rn | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
