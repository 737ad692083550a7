#!/usr/bin/env bash
# Stop 45, call 7 (carry [".snap/prebuilt.txz", ".snap/c7.sh"]; <= ~420 s, sections guarded by the elapsed time; run as
# C7_COMMIT=<commit> bash .snap/c7.sh): the lean kernel's one-addition epilogue without a row scale
# (GemmParams::lean_unit_epilogue, on; FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE=0 the three operations).
# (1) Tests: LeanKernelSameBits whole (the lean kernel's bits against the general kernel's, every height, pair mode
#     and scale-warp setting, dynamic and static recipes), the switch tests, LeanScaleWarpManyTiles and SharedATilesPastN,
#     the gated FP4 lean kernel (Fp4Linear.ExactFoldSpreads/cuda).
# (2) A/B in one process, twice: M = 4096 over issue 3's seven (N, K), default against =0; then M = 512 and 2048.
# (3) bench/linear.py at M = 512 and 4096 over the seven (N, K), cuBLASLt in the same run.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits' >$W/lin_same.log 2>&1 &
timeout 120 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*:CudaTest.LeanScaleWarpManyTiles:CudaTest.SharedATilesPastN' >$W/lin_other.log 2>&1 &
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*ExactFoldSpreads/cuda:*ExactLeanKernelExpansion/cuda' >$W/fp4.log 2>&1 &
wait
echo "tests $(el)"
for f in lin_same lin_other fp4; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is" $W/$f.log | head -8; tail -n 1 $W/$f.log; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-36s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
for rep in 1 2; do
  if left 200; then
    timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 2112:7168,24576:1536,32768:512,7168:16384,4096:7168,7168:2048,576:7168 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE=0" >$W/ab_$rep.jsonl 2>$W/ab_$rep.err
    echo "-- M = 4096, run $rep $(el)"; show $W/ab_$rep.jsonl; tail -n 1 $W/ab_$rep.err
  fi
done
if left 270; then
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 512,2048 --nk 4096:7168,7168:16384,24576:1536 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE=0" >$W/ab_mid.jsonl 2>$W/ab_mid.err
  echo "-- M = 512 and 2048 $(el)"; show $W/ab_mid.jsonl
fi
if left 300; then
  FINEGEMM_COMMIT=${C7_COMMIT:-unknown} timeout 100 python3 ../bench/linear.py --bench $B/bench/bench_cuda_linear --m 512,4096 \
    --nk 2112:7168,24576:1536,32768:512,7168:16384,4096:7168,7168:2048,576:7168 --variants block-fp32-dynamic \
    --out $W/linear.json >$W/linear.txt 2>$W/linear.err
  echo "-- linear.py M = 512, 4096 against cuBLASLt $(el)"; grep -vE "^\{" $W/linear.txt | tail -20; tail -n 2 $W/linear.err | cut -c1-200
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
