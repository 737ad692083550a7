#!/usr/bin/env bash
# Stop 44, call 5 (carry [".snap/prebuilt.txz", ".snap/c5.sh"]; <= ~420 s, every section guarded by the elapsed time;
# run as C5_COMMIT=<commit> bash .snap/c5.sh): the two defaults stop 44 changed, tested and timed against the old
# behaviour in the same process, plus repeats of the bars nearest their line.
# (1) Tests, three programs at once: test_cuda_linear's switch tests and the full LeanKernelSameBits (its M = 2048
#     K = 1408 case now runs with FINEGEMM_GEMM_LEAN_PAIR unset, which takes the pairs sharing A by shape),
#     test_cuda_fp4's FP4 MoE tests (the lean scan-only calls' wide scan, now the default, against
#     FINEGEMM_FP4_EXPAND_WIDE=0's tiles scan, bit for bit) and the linear FP4 tests but the slow
#     ExactMixedBlocksAlongK, test_cuda_moe's recipes on the default paths.
# (2) bench/linear.py at M = 4096 over issue 3's seven (N, K): the new default against FINEGEMM_GEMM_LEAN_PAIR=0 (the
#     stop 43 default), cuBLASLt in the same run; then M = 512 at the short-K shapes with the pairs forced (=a) against
#     the default (unpaired below M = 2048), to see whether the rule should reach M = 512.
# (3) Dense FP4 prefill M = 4096 N = 4096 K = 7168 beside FP8, run twice (issue 5: FP4 >= 85% of FP8).
# (4) DeepSeek-V3 FP4 layer at T = 4096, the new default (wide scan on the lean kernel's scan-only calls) against
#     FINEGEMM_FP4_EXPAND_WIDE=0, alternated twice; the FP8 layer once.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 170 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*:CudaTest.LeanKernelSameBits' >$W/lin_tests.log 2>&1 &
timeout 170 $B/tests/test_cuda_fp4 --gtest_filter='*/cuda-*ExactMixedBlocksAlongK*' >$W/fp4_tests.log 2>&1 &
timeout 170 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipeMatchesReference' >$W/moe_tests.log 2>&1 &
wait
echo "tests $(el)"
for f in lin_tests fp4_tests moe_tests; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is" $W/$f.log | head -8; tail -n 1 $W/$f.log; done
if left 250; then
  FINEGEMM_COMMIT=${C5_COMMIT:-unknown} timeout 90 python3 ../bench/linear.py --bench $B/bench/bench_cuda_linear --m 4096 \
    --nk 2112:7168,24576:1536,32768:512,7168:16384,4096:7168,7168:2048,576:7168 --variants block-fp32-dynamic \
    --envs ";FINEGEMM_GEMM_LEAN_PAIR=0" --out $W/linear_4096.json >$W/linear_4096.txt 2>$W/linear_4096.err
  echo "-- linear.py M = 4096, default (pairs sharing A at K <= 1536) and FINEGEMM_GEMM_LEAN_PAIR=0 $(el)"
  grep -vE "^\{" $W/linear_4096.txt | tail -20; tail -n 2 $W/linear_4096.err | cut -c1-200
fi
if left 290; then
  FINEGEMM_COMMIT=${C5_COMMIT:-unknown} timeout 40 python3 ../bench/linear.py --bench $B/bench/bench_cuda_linear --m 512 \
    --nk 24576:1536,32768:512,7168:2048 --variants block-fp32-dynamic \
    --envs ";FINEGEMM_GEMM_LEAN_PAIR=a" --out $W/linear_512.json >$W/linear_512.txt 2>$W/linear_512.err
  echo "-- linear.py M = 512, default and pairs sharing A $(el)"
  grep -vE "^\{" $W/linear_512.txt | tail -10; tail -n 2 $W/linear_512.err | cut -c1-200
fi
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-28s graph=%8.2f us ev=%8.2f %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
for rep in 1 2; do
  if left 320; then
    timeout 30 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_fp4_$rep.jsonl 2>$W/dense_fp4_$rep.err
    echo "-- dense FP4 and FP8, run $rep $(el)"; show $W/dense_fp4_$rep.jsonl
  fi
done
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us graph=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r.get("layer_us_graph")))
    else: print(l.rstrip()[:200])'; }
for rep in 1 2; do
  for wide in default 0; do
    if left 400; then
      if [ $wide = default ]; then env -u FINEGEMM_FP4_EXPAND_WIDE timeout 25 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/moe_fp4_${wide}_$rep.log 2>&1
      else FINEGEMM_FP4_EXPAND_WIDE=0 timeout 25 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/moe_fp4_${wide}_$rep.log 2>&1; fi
      echo "-- DeepSeek-V3 FP4 T = 4096, FINEGEMM_FP4_EXPAND_WIDE=$wide, run $rep $(el)"; showmoe $W/moe_fp4_${wide}_$rep.log
    fi
  done
done
if left 420; then
  timeout 25 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/moe_fp8.log 2>&1
  echo "-- DeepSeek-V3 FP8 T = 4096 $(el)"; showmoe $W/moe_fp8.log
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
