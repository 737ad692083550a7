#!/usr/bin/env bash
# Stop 58, call 6 (H200 wanted; LIMIT=<timeout_s>): (1) the new default (192-row grouped lean tiles from 96 rows per
# expert where K or N >= 4096: both DeepSeek-V3 Store GEMMs, as =192 forced them in call 4) against the general
# kernel (=0, the old default below 256 rows), interleaved, three rounds, DeepSeek-V3 T = 3072 / 4096 / 6144, with the FP4 layer at T = 4096 (issue 5's MoE prefill) and Qwen3 T = 2048;
# (2) the grouped lean tests (run first: the new code's check); (3) initcheck of GroupedLeanSameBits after the consumers' A-scale rows clamp to the
# tile's last routed row.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-560}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {  # name layer T recipes env...
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 80 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-26s %-14s T=%-5d %-22s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*' >$W/test_lean.txt 2>&1
echo "-- test_cuda_moe *GroupedLean* rc=$? $(el): $(grep -c '^\[       OK' $W/test_lean.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test_lean.txt | head -3 | tr '\n' ' ')"
grep -B2 -A6 "Failure" $W/test_lean.txt | head -30
for round in 1 2 3; do
  left $(( LIMIT - 170 )) || break
  echo "-- round $round $(el)"
  for T in 3072 4096 6144; do
    one dsv3_${T}_new_$round deepseek-v3 $T dynamic X=1
    one dsv3_${T}_l0_$round deepseek-v3 $T dynamic FINEGEMM_GROUPED_LEAN=0
  done
  one dsv3_4096_fp4_$round deepseek-v3 4096 fp4 X=1
  one qwen_2048_new_$round qwen3-30b-a3b 2048 dynamic X=1
done
if left $(( LIMIT - 120 )); then
  timeout $(( LIMIT - 20 - ($(date +%s) - s0) )) compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
  echo "-- initcheck GroupedLeanSameBits rc=$? $(el)"; grep -E "ERROR SUMMARY|Uninitialized|at .*cuh:[0-9]+|PASSED|FAILED" $W/initcheck.txt | sort | uniq -c | sort -rn | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
