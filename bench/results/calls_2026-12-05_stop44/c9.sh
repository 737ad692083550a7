#!/usr/bin/env bash
# Stop 44, call 9 (not yet run; carry [".snap/prebuilt.txz", ".snap/c9.sh"]; ~150-400 s, every section guarded by the elapsed time,
# the cheapest verdict first; run as C9_COMMIT=<commit> bash .snap/c9.sh): the lean kernel's B scales from a scale
# warp (FINEGEMM_GEMM_LEAN_SFB_WARP=1, written at stop 44 without a GPU).
# (1) Its tests: LeanScaleWarpManyTiles (five or more tiles per CTA, every height and pair mode, same bits as the
#     consumers' loads and the general kernel), the switch test, quick LeanKernelSameBits, and the FP4 gated lean
#     kernel under both settings (Fp4Linear.ExactFoldSpreads/cuda).
# (2) bench_cuda_linear A/B in one process, default against =1: M = 4096 at N = 4096 K = 7168 (issue 3's 1400 TFLOP/s
#     bar), N = 7168 K = 16384, N = 32768 K = 512 (pairs sharing A by default), N = 2112 K = 7168, then the dense FP4
#     prefill (the gated lean GEMM) at N = 4096 K = 7168.
# (3) memcheck and racecheck of LeanScaleWarpManyTiles under FINEGEMM_TEST_QUICK=1.
# (4) bench_cuda_dram_pattern on the dense E4M3 and FP4 weight sets, with the FP4 decode kernel's 64-byte rows.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanScaleWarpManyTiles:GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/lin_tests.log 2>&1 &
FINEGEMM_TEST_QUICK=1 timeout 90 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits' >$W/lin_quick.log 2>&1 &
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*ExactFoldSpreads/cuda' >$W/fp4_tests.log 2>&1 &
wait
echo "tests $(el)"
for f in lin_tests lin_quick fp4_tests; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is" $W/$f.log | head -8; tail -n 1 $W/$f.log; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-30s graph=%8.2f us ev=%8.2f %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
if left 150; then
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384,32768:512,2112:7168 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_SFB_WARP=1" >$W/sfb.jsonl 2>$W/sfb.err
  echo "-- FP8 M = 4096, default and the scale warp $(el)"; show $W/sfb.jsonl; tail -n 1 $W/sfb.err
fi
if left 200; then
  timeout 30 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_SFB_WARP=1" >$W/sfb_fp4.jsonl 2>$W/sfb_fp4.err
  echo "-- dense FP4 and FP8 4096:4096:7168, default and the scale warp $(el)"; show $W/sfb_fp4.jsonl
fi
if left 240; then
  for tool in memcheck racecheck; do
    FINEGEMM_TEST_QUICK=1 timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanScaleWarpManyTiles' >$W/san_$tool.log 2>&1
    echo "compute-sanitizer $tool (scale warp): rc=$? $(grep -E SUMMARY $W/san_$tool.log | tail -1) $(el)"
  done
fi
if left 330; then
  # (4) The FP4 decode kernel's read pattern (64-byte rows per stage) without arithmetic, beside the E4M3 kernel's.
  timeout 60 $B/bench/bench_cuda_dram_pattern --set dense,fp4_dense --quick >$W/dram.jsonl 2>$W/dram.err
  echo "-- read patterns $(el)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-10s %-75s %6.3f TB/s" % (r["set"], r["change"][:75], r["tbps"]))' $W/dram.jsonl
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
