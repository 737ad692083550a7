#!/usr/bin/env bash
# Stop 40, the broader FP4 call (after c1..c2; carry [".snap"] after scripts/pack-prebuilt; ~8 min): what stop 40 wrote without a GPU, and stop
# 39's unrun c8. (1) The FP4 tests (*Moe*:*Lean*: both expansion orders of the FP4 lean kernel, the crafted-spread bar
# from the Hopper accumulation model, at stop 39's failing seed too) beside the MoE tests that reach the FP4 lean
# default. (2) The DeepSeek-V3 FP4 layer at T = 1024/2048/4096: default (lean 192, serial), FINEGEMM_FP4_LEAN_EXPAND=
# batched, FINEGEMM_MOE_DECODE=1 (the swap-AB decode kernel in chunks of 64 tokens: never timed at prefill sizes) and
# FINEGEMM_FP4_LEAN=0 (expanded), with the FP8 layer for the ratio; Qwen3 FP4 default vs FINEGEMM_FP4_LEAN=0.
# (3) Dense FP4 at M = 4096, N = 4096 K = 7168 and N = 7168 K = 16384: the expanded path (default), the expanded path
# with its E4M3 GEMM in the gated lean kernel (FINEGEMM_FP4_EXPAND_LEAN=1: issue 5's 85% bar if it runs at the lean
# kernel's E4M3 speed), lean FP4 serial and batched, and the FP8 GEMM for the ratio; the dense E4M3 default at M = 4096 N = 32768
# K = 512 (192 rows now, d09d199) beside FINEGEMM_GEMM_LEAN=256. (4) memcheck of the dense lean FP4 quick test.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 110 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipeMatchesReference:CudaMoe.GateUpFusedAndUnfusedEveryRecipe:CudaMoe.GroupedTileHeightsEveryRecipe:CudaMoe.SkewedRoutingEmptyExpertsAndOneExpertTakesAll' >$W/moe_tests.log 2>&1 &
timeout 110 $B/tests/test_cuda_fp4 --gtest_filter='*Moe*:*Lean*:*ExactFoldSpreads*' >$W/fp4_tests.log 2>&1 &
wait
FINEGEMM_TEST_SEED=17575496020904828288 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/moe_seed.log 2>&1
echo "tests $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is|seed" $W/moe_tests.log $W/fp4_tests.log $W/moe_seed.log | head -24
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us gemm %6.1f TF" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r["gemm_tflops"]))
    else: print(l.rstrip()[:200])'; }
i=0
for e in "" "FINEGEMM_FP4_LEAN_EXPAND=batched" "FINEGEMM_MOE_DECODE=1" "FINEGEMM_FP4_LEAN=0"; do
  i=$((i+1)); env $e timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1024,2048,4096 --recipes fp4 --check-tokens 1 >$W/ds_fp4_$i.log 2>&1
  echo "-- deepseek-v3 fp4 ${e:-default} $(el)"; showmoe $W/ds_fp4_$i.log
done
timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1024,2048,4096 --recipes dynamic --check-tokens 1 >$W/ds_fp8.log 2>&1
echo "-- deepseek-v3 fp8 $(el)"; showmoe $W/ds_fp8.log
for e in "" "FINEGEMM_FP4_LEAN=0"; do
  env $e timeout 30 $B/bench/bench_cuda_moe --layers qwen3-30b-a3b --tokens 1024,2048,4096 --recipes fp4 --check-tokens 1 >$W/qw_fp4_${e:+off}.log 2>&1
  echo "-- qwen3 fp4 ${e:-default} $(el)"; showmoe $W/qw_fp4_${e:+off}.log
done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-16s M=%-5d N=%-6d K=%-6d %-44s ev=%8.2f graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us"], r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
for s in 4096:7168 7168:16384; do
  timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk $s --variants mxfp4-group128 --envs "FINEGEMM_FP4_LEAN=0;FINEGEMM_FP4_EXPAND_LEAN=1;FINEGEMM_FP4_LEAN=1;FINEGEMM_FP4_LEAN=1,FINEGEMM_FP4_LEAN_EXPAND=batched" >$W/dense_fp4_${s/:/_}.jsonl 2>$W/dense_fp4_${s/:/_}.err
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk $s --variants block-fp32-dynamic >>$W/dense_fp4_${s/:/_}.jsonl 2>>$W/dense_fp4_${s/:/_}.err
  echo "-- dense fp4 $s (expanded, expanded + gated lean, lean serial, lean batched; then FP8) $(el)"; show $W/dense_fp4_${s/:/_}.jsonl; tail -2 $W/dense_fp4_${s/:/_}.err
done
timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 32768:512 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN=256;FINEGEMM_GEMM_LEAN=192" >$W/short_k.jsonl 2>$W/short_k.err
echo "-- M=4096 N=32768 K=512 $(el)"; show $W/short_k.jsonl; tail -2 $W/short_k.err
FINEGEMM_TEST_QUICK=1 timeout 60 compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLeanKernelExpansion/cuda' >$W/memcheck_dense.log 2>&1
echo "memcheck dense lean (both orders) rc=$? $(el)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $W/memcheck_dense.log | head -3
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
