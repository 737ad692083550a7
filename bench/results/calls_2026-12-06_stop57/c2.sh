#!/usr/bin/env bash
# Stop 57 call 2 (carry [".snap/prebuilt.txz", ".snap/c2.sh"] after scripts/pack-prebuilt;
# LIMIT = the call's timeout_s): the FP4 lean kernel's
# issuer experiments (FINEGEMM_FP4_LEAN_ISSUER=light / rotate) against the default.
# (1) the DeepSeek-V3 FP4 layer at T = 4096, default / light / rotate interleaved, three rounds, and the FP8 layer
# once; (2) the ring trace of each experiment; (3) their same-bits tests; (4) initcheck of GroupedLeanSameBits.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; LIMIT=${LIMIT:-500}; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for round in 1 2 3; do
  for v in 0 light rotate; do
    FINEGEMM_FP4_LEAN_ISSUER=$v timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ab_${v}_$round.jsonl 2>$W/ab_${v}_$round.err
    echo "-- FP4 T=4096 FINEGEMM_FP4_LEAN_ISSUER=$v round $round rc=$? $(el)"; show $W/ab_${v}_$round.jsonl
  done
done
timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/fp8.jsonl 2>$W/fp8.err
echo "-- FP8 T=4096 rc=$? $(el)"; show $W/fp8.jsonl
for v in rotate light; do
  if left $(( LIMIT - 80 )); then
    FINEGEMM_FP4_LEAN_ISSUER=$v FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring_$v.txt timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring_$v.jsonl 2>$W/ring_$v.err
    echo "-- ring trace $v rc=$? $(el)"; python3 $ROOT/scripts/fp4-lean-ring $W/ring_$v.txt --mhz 1980 2>&1 | tee $W/ring_${v}_summary.txt | head -22
    rm -f $W/ring_$v.txt
  fi
done
if left $(( LIMIT - 160 )); then
  timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='*CraftedSpread*' >$W/test_fp4.txt 2>&1
  echo "-- test_cuda_fp4 CraftedSpread rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |Failure|test data seed" $W/test_fp4.txt | head -12
  timeout 30 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*' >$W/test_switch.txt 2>&1
  echo "-- test_cuda_linear GemmConfig rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |Failure" $W/test_switch.txt | head -6
fi
if left $(( LIMIT - 90 )); then
  timeout $(( LIMIT - 30 - ($(date +%s) - s0) )) compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
  echo "-- initcheck GroupedLeanSameBits rc=$? $(el)"; grep -E "ERROR SUMMARY|Uninitialized|at .*cuh:[0-9]+" $W/initcheck.txt | sort | uniq -c | sort -rn | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
