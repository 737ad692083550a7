#!/usr/bin/env bash
# Stop 55, call 5 (carry [".snap/prebuilt.txz", ".snap/c5.sh"]; <= ~150 s, the last of the device time: the probe, one A/B round, the layer rows; call 1 never got a device, so this one
# carries its parts): binaries of HEAD with FINEGEMM_FP4_LEAN_PACKED_ISSUER=32 (warp 1's first producer thread issues
# the grouped 192-row FP4 lean kernel's packed tiles; thread 0 keeps A's).
# In this order: (1) the TMA issue probe (bench/micro/tma_issue.cu, first run); (4) the A/B; (3) the rows; (5); (2) tests: the crafted-spread MoE test (with the new
# switch's same-bits check) under stop 54 call 6's filter and seed, the switch's parsing; (3) DeepSeek-V3 FP8 and FP4
# at T = 1, 16, 4096 (the bars' rows); (4) FP4 T = 4096 A/B, default against =32, fp4-only processes, two rounds;
# (5) dense prefill M = 4096 FP4 against FP8 twice, decode M = 1 / 16 / 64 over issue 3's three shapes; (6) on an
# H200 only: ncu of the FP8 expert GEMMs at T = 4096 and the layers at T = 16384; (7) the two diagnostic traces
# (the diagnostic_trace_buffer refactor's users); (8) test_cuda_moe's lean and FP4 tests.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us graph %8s gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph"), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
lin() { cat "$@" | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%-5d N=%-6d K=%-6d %-18s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
H200=0; grep -q H200 $W/gpu.txt && H200=1
timeout 60 $B/bench/micro_tma_issue >$W/tma_issue.txt 2>&1; echo "-- tma_issue rc=$? $(el)"; tail -8 $W/tma_issue.txt
for round in 1; do
  for pi in 0 32; do
    FINEGEMM_FP4_LEAN_PACKED_ISSUER=$pi timeout 45 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ab_${pi}_$round.jsonl 2>$W/ab_${pi}_$round.err
    echo "-- FP4 T=4096 PACKED_ISSUER=$pi round $round rc=$? $(el)"; show $W/ab_${pi}_$round.jsonl
  done
done
timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe.jsonl 2>$W/moe.err
echo "-- DeepSeek-V3 T=1,16,4096 rc=$? $(el)"; show $W/moe.jsonl
if left 120; then
  FINEGEMM_TEST_SEED=18343406184352838198 timeout 50 $B/tests/test_cuda_fp4 --gtest_filter='*CraftedSpread*' >$W/test_fp4.txt 2>&1
  echo "-- crafted spread rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |Failure|actual|Which is" $W/test_fp4.txt | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
