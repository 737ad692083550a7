#!/usr/bin/env bash
# Stop 54, call 4 (carry [".snap/prebuilt.txz", ".snap/c4.sh"]; <= ~420 s). Call 3's ring trace had the FP4 lean
# kernel's producer thread 0 (which issues the TMA loads) ~0.45 µs per K block behind the other producers, in its
# issuing, and the stages waiting on it. (1) tests: test_cuda_fp4's lean / scan / crafted-spread MoE tests (the
# 2-CTA clusters sharing A, FINEGEMM_FP4_LEAN_SHARE_A=1, against the unpaired kernel's bits), test_cuda_moe's lean
# and FP4 tests; (2) the ring trace of gate_up at T = 4096 with the issue split into A's block and issue_packed, by
# default and with A issued by consumer thread 0 (FINEGEMM_FP4_LEAN_A_ISSUER=consumer); (3) the DeepSeek-V3 FP4
# layer at T = 4096: default, A_ISSUER=consumer, SHARE_A=1, with the FP8 layer, three rounds.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*:*CraftedSpread*' >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 lean/scan/crafted rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_fp4.txt | head -12
timeout 100 $B/tests/test_cuda_linear --gtest_filter='*Switch*' >$W/test_switch.txt 2>&1; echo "-- test_cuda_linear switches rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_switch.txt | head -6
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_moe.txt | head -12
for issuer in producer consumer; do
  FINEGEMM_FP4_LEAN_A_ISSUER=$issuer FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring_a$issuer.txt FINEGEMM_FP4_LEAN_TRACE_CALL=4 timeout 100 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring_a$issuer.jsonl 2>$W/ring_a$issuer.err
  echo "-- ring trace gate_up, A issued by $issuer thread 0 rc=$? $(el)"
  python3 $ROOT/scripts/fp4-lean-ring $W/ring_a$issuer.txt --mhz 1980 2>&1 | head -22
done
for round in 1 2 3; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/base_$round.jsonl 2>$W/base_$round.err
  echo "-- default round $round $(el)"; show $W/base_$round.jsonl
  for v in "A_ISSUER=consumer" "SHARE_A=1"; do
    tag=$(echo "$v" | tr ' =' '__')
    env FINEGEMM_FP4_LEAN_$v timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/v_${tag}_$round.jsonl 2>$W/v_${tag}_$round.err
    echo "-- FINEGEMM_FP4_LEAN_$v round $round rc=$? $(el)"; show $W/v_${tag}_$round.jsonl; tail -1 $W/v_${tag}_$round.err
  done
done
gzip -f $W/ring_*.txt
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
