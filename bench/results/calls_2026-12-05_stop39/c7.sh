#!/usr/bin/env bash
# Stop 39, call 7 (carry [".snap"] after scripts/pack-prebuilt): the FP4 lean kernel now on by default for the MoE Store
# GEMMs from 64 to 255 rows per expert. The MoE tests that reach it (T = 300 over 16 experts: ~150 rows each), the FP4
# tests, memcheck on the lean FP4 tests, then the FP4 layers by default against FINEGEMM_FP4_LEAN=0 over T.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipeMatchesReference:CudaMoe.GateUpFusedAndUnfusedEveryRecipe:CudaMoe.GroupedTileHeightsEveryRecipe:CudaMoe.SkewedRoutingEmptyExpertsAndOneExpertTakesAll:CudaMoe.DeterministicAndCapturableInOneGraph' >$W/moe_tests.log 2>&1 &
timeout 150 $B/tests/test_cuda_fp4 >$W/fp4_tests.log 2>&1 &
wait
echo "moe + fp4 tests $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is|seed" $W/moe_tests.log $W/fp4_tests.log | head -20
FINEGEMM_TEST_QUICK=1 timeout 60 compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLeanKernelExpansion/cuda' >$W/memcheck_dense.log 2>&1
echo "memcheck dense lean rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/memcheck_dense.log | head -3
timeout 70 compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/memcheck_moe.log 2>&1
echo "memcheck FP4 MoE (lean heights) rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/memcheck_moe.log | head -3
for e in "" "FINEGEMM_FP4_LEAN=0"; do
  [ $(( $(date +%s) - s0 )) -lt 190 ] || break
  env $e timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 1024,2048,4096,8192 --recipes fp4 --check-tokens 1 >$W/moe_fp4_${e:-default}.log 2>&1
  echo "-- ${e:-default} $(el)"; grep -vE "^#|^$" $W/moe_fp4_${e:-default}.log | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us gemm %6.1f TF" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r["gemm_tflops"]))
    else: print(l.rstrip()[:200])'
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
