#!/usr/bin/env bash
# Stop 54, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~400 s). (1) tests: test_cuda_moe's lean / FP4
# tests (GroupedLeanByDefault's K >= 4096 band), test_cuda_fp4's lean and scan tests; (2) the FP8 layer at 48-80 rows
# per expert: the default (128-row lean tiles at K >= 4096: DeepSeek-V3's gate_up only) against FINEGEMM_GROUPED_LEAN
# =128 (both GEMMs) and =0, DeepSeek-V3 T = 1536 / 2048 / 2560 and Qwen3-30B-A3B T = 1024, two rounds; (3) the FP4
# lean kernel's ring trace (the kRingTrace build) of the DeepSeek-V3 FP4 layer's gate_up and down at T = 4096, with
# the SM clock sampled; (4) the FP4 and FP8 layers at T = 4096, two rounds; (5) the FP8 layer at T = 4096 with the
# general kernel's 2-CTA clusters sharing A (FINEGEMM_GROUPED_CLUSTER=1, never measured), two rounds.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_moe.txt | head -12
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*' >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 lean/scan rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_fp4.txt | head -12
for round in 1 2; do
  for gl in default 128 0; do
    if [ $gl = default ]; then unset FINEGEMM_GROUPED_LEAN; else export FINEGEMM_GROUPED_LEAN=$gl; fi
    timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1536,2048,2560 --recipes dynamic --check-tokens 1 >$W/ds_${gl}_$round.jsonl 2>$W/ds_${gl}_$round.err
    timeout 60 $B/bench/bench_cuda_moe --layers qwen3-30b-a3b --tokens 1024 --recipes dynamic --check-tokens 1 >$W/qw_${gl}_$round.jsonl 2>$W/qw_${gl}_$round.err
    echo "-- FP8 GROUPED_LEAN=$gl round $round $(el)"; show $W/ds_${gl}_$round.jsonl $W/qw_${gl}_$round.jsonl
  done
done
unset FINEGEMM_GROUPED_LEAN
for call in 4 5; do
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader -lms 50 >$W/clock_$call.csv 2>&1 &
  SMI=$!
  FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring_$call.txt FINEGEMM_FP4_LEAN_TRACE_CALL=$call timeout 100 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring_$call.jsonl 2>$W/ring_$call.err
  echo "-- ring trace call $call rc=$? $(el)"; kill $SMI 2>/dev/null; wait $SMI 2>/dev/null
  MHZ=$(python3 -c "
import sys
v=[int(l.split()[0]) for l in open('$W/clock_$call.csv') if l.strip() and l.split()[0].isdigit()]
v=[x for x in v if x>1000]; v.sort(); print(v[len(v)//2] if v else 1755)")
  echo "  SM clock median under load: $MHZ MHz"
  python3 $ROOT/scripts/fp4-lean-ring $W/ring_$call.txt --mhz $MHZ 2>&1 | head -20
done
for round in 1 2; do
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe4096_$round.jsonl 2>$W/moe4096_$round.err
  echo "-- T=4096 FP8/FP4 round $round rc=$? $(el)"; show $W/moe4096_$round.jsonl
done
for round in 1 2; do
  FINEGEMM_GROUPED_CLUSTER=1 timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/cluster_$round.jsonl 2>$W/cluster_$round.err
  echo "-- FP8 T=4096 FINEGEMM_GROUPED_CLUSTER=1 (2-CTA clusters sharing A) round $round rc=$? $(el)"; show $W/cluster_$round.jsonl
done
gzip -f $W/ring_*.txt
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
