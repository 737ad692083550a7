#!/usr/bin/env bash
# Stop 30 call 3: the FP4 GEMV v2 (every step's data through the warp's cp.async ring; M <= 16): its exact tests, then
# against the wgmma decode kernel on the same data (graph replay, every row checked against the CPU reference) at
# M = 1, 8, 16 over the seven (N, K), group-32 activations on two shapes, then the rest of test_cuda_fp4.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d %-16s env=%-12s graph=%8.2f gbps=%7.1f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], (r["env"] or "default").replace("FINEGEMM_FP4_",""), r["us_graph"], r["gbps"], r["rel_err"]))
' $1; }
timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='*ExactGemvPaths*' >$W/t_gemv.txt 2>&1
echo "ExactGemvPaths rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_gemv.txt | tr '\n' ' ')"; grep -A8 Failure $W/t_gemv.txt | head -40
FINEGEMM_PRINT_CONFIG=1 timeout 200 $B/bench/bench_cuda_linear --m 1,8,16 --variants mxfp4-group128 --envs 'FINEGEMM_FP4_GEMV=0;FINEGEMM_FP4_GEMV=1' >$W/b_fp4.txt 2>$W/b_fp4.err
echo "bench fp4 rc=$? ($(( $(date +%s) - s0 )) s)"; show $W/b_fp4.txt; grep -o 'fp4 gemv M=.*' $W/b_fp4.err | sort -u | head -24
for nk in 7168:16384 4096:7168; do
  timeout 60 $B/bench/bench_cuda_linear --m 1,16 --nk $nk --variants mxfp4-group32 --envs 'FINEGEMM_FP4_GEMV=0;FINEGEMM_FP4_GEMV=1' >$W/b_g32_${nk/:/_}.txt 2>&1
  echo "bench g32 $nk rc=$?"; show $W/b_g32_${nk/:/_}.txt
done
timeout $(( 560 - ($(date +%s) - s0) )) $B/tests/test_cuda_fp4 --gtest_filter='-*ExactGemvPaths*' >$W/t_fp4.txt 2>&1
echo "test_cuda_fp4 (the rest) rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_fp4.txt | tr '\n' ' ')"; grep -E '^\[  FAILED' $W/t_fp4.txt | head; grep -A8 Failure $W/t_fp4.txt | head -30
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
