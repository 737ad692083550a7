#!/usr/bin/env bash
# Stop 44, call 1 (stop 43's c5.sh with the time guards widened for a fresh budget; carry [".snap/prebuilt.txz", ".snap/c1.sh"];
# ~110-190 s of command, every section guarded by the elapsed time): the defaults changed at stop 43 and the wide FP4
# expansion kernel (128 groups per warp, FINEGEMM_FP4_EXPAND_WIDE=1), tested and timed.
# (1) Tests, three programs at once: test_cuda_fp4 on the GPU but its slow ExactMixedBlocksAlongK (the expansion's
#     tile / row / unfoldable paths through ExactFoldSpreads and the rest; the MoE decode path's permuted default in
#     Fp4Moe.ExpertsWithCraftedSpreadsMatchReference), test_cuda_linear's switch test and quick LeanKernelSameBits,
#     test_cuda_moe's recipes and decode path.
# (2) Dense FP4 prefill M = 4096 N = 4096 K = 7168 by default (expansion + gated lean GEMM), with the wide expansion
#     kernel (FINEGEMM_FP4_EXPAND_WIDE=1), with it and the wide fold scan (=2; their test, ExactWideExpansion, runs
#     in (1)) and with the general GEMM
#     (FINEGEMM_FP4_EXPAND_LEAN=0), the FP8 GEMM beside (issue 5: FP4 at >= 85% of FP8's speed: 205.6 vs 173.9 µs).
# (3) DeepSeek-V3 FP4 layer, T = 1 and 16 (the permuted decode default) and T = 4096 (the batched lean default), and
#     T = 4096 with the wide scan on the lean kernel's scan-only calls (FINEGEMM_FP4_EXPAND_WIDE=2).
# (4) bench/linear.py at M = 4096 on N = 32768 K = 512 and N = 24576 K = 1536 (the shapes under 1.0x cuBLASLt at stop
#     39), default and with the lean pairs sharing A (FINEGEMM_GEMM_LEAN_PAIR=a), cuBLASLt in the same run.
# Run as: C5_COMMIT=<commit> bash .snap/c1.sh
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*/cuda-*ExactMixedBlocksAlongK*' >$W/fp4_tests.log 2>&1 &
FINEGEMM_TEST_QUICK=1 timeout 60 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*:CudaTest.LeanKernelSameBits' >$W/lin_tests.log 2>&1 &
timeout 75 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipeMatchesReference:CudaMoe.DecodePathEveryServedRecipe' >$W/moe_tests.log 2>&1 &
wait
echo "tests $(el)"
for f in fp4_tests lin_tests moe_tests; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is" $W/$f.log | head -8; tail -n 1 $W/$f.log; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-28s graph=%8.2f us ev=%8.2f %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
if left 200; then
  timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=1;FINEGEMM_FP4_EXPAND_WIDE=2;FINEGEMM_FP4_EXPAND_LEAN=0" >$W/dense_fp4.jsonl 2>$W/dense_fp4.err
  echo "-- dense FP4 (default, wide expansion, general GEMM) and FP8 $(el)"; show $W/dense_fp4.jsonl; tail -n 1 $W/dense_fp4.err
fi
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us graph=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r.get("layer_us_graph")))
    else: print(l.rstrip()[:200])'; }
if left 260; then
  timeout 30 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes fp4 --check-tokens 1 >$W/moe_fp4.log 2>&1
  echo "-- DeepSeek-V3 FP4 T = 1, 16, 4096 (defaults) $(el)"; showmoe $W/moe_fp4.log
  FINEGEMM_FP4_EXPAND_WIDE=2 timeout 25 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/moe_fp4_wide.log 2>&1
  echo "-- DeepSeek-V3 FP4 T = 4096, FINEGEMM_FP4_EXPAND_WIDE=2 $(el)"; showmoe $W/moe_fp4_wide.log
fi
if left 330; then
  FINEGEMM_COMMIT=${C5_COMMIT:-unknown} timeout 50 python3 ../bench/linear.py --bench $B/bench/bench_cuda_linear --m 4096 --nk 32768:512,24576:1536 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_PAIR=a" --out $W/linear_pairs.json >$W/linear_pairs.txt 2>$W/linear_pairs.err
  echo "-- linear.py M = 4096, default and pairs sharing A $(el)"; grep -vE "^\{" $W/linear_pairs.txt | tail -8; tail -n 2 $W/linear_pairs.err | cut -c1-200
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
