#!/usr/bin/env bash
# Stop 39, call 8 (carry [".snap"] after scripts/pack-prebuilt; a shorter c7 for the budget left): the MoE tests that
# reach the FP4 lean default (T = 300 over 16 experts: ~150 rows each) and the FP4 tests, side by side; memcheck on the
# dense lean FP4 test's quick form; the Qwen3 FP4 layer (not measured before) by default against FINEGEMM_FP4_LEAN=0.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 95 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipeMatchesReference:CudaMoe.GateUpFusedAndUnfusedEveryRecipe:CudaMoe.GroupedTileHeightsEveryRecipe:CudaMoe.SkewedRoutingEmptyExpertsAndOneExpertTakesAll' >$W/moe_tests.log 2>&1 &
timeout 95 $B/tests/test_cuda_fp4 --gtest_filter='*Moe*:*Lean*' >$W/fp4_tests.log 2>&1 &
wait
for e in "" "FINEGEMM_FP4_LEAN=0"; do
  env $e timeout 25 $B/bench/bench_cuda_moe --layers qwen3-30b-a3b --tokens 1024,2048,4096 --recipes fp4 --check-tokens 1 >$W/moe_fp4_${e:-default}.log 2>&1
done
echo "moe + fp4 tests $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is|seed" $W/moe_tests.log $W/fp4_tests.log | head -20
for e in default FINEGEMM_FP4_LEAN=0; do echo "-- $e"; grep -vE "^#|^$" $W/moe_fp4_$e.log | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us gemm %6.1f TF" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r["gemm_tflops"]))
    else: print(l.rstrip()[:200])'; done
FINEGEMM_TEST_QUICK=1 timeout 25 compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLeanKernelExpansion/cuda' >$W/memcheck_dense.log 2>&1
echo "memcheck dense lean rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/memcheck_dense.log | head -3
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
