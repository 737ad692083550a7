#!/usr/bin/env bash
# Stop 30 call 6 (binaries with the GEMV default, M <= 8 at N <= 768): the FP4 decode tests that now run both decode
# kernels (ExactDecodePathsSmall, ExactGemvPaths), then call 5's tile-config comparison (env switches only).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*ExactDecodePathsSmall*:*ExactGemvPaths*:*ExactFoldSpreads*' >$W/t_fp4.txt 2>&1
echo "test_cuda_fp4 (decode) rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_fp4.txt | tr '\n' ' ')"; grep -A8 Failure $W/t_fp4.txt | head -30
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d env=%-30s graph=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
C=FINEGEMM_GEMM_CONFIG
for s in 64:24576:1536 48:24576:1536 64:32768:512 48:32768:512 64:16384:1536 40:24576:2048; do
  IFS=: read -r m n k <<<"$s"
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$C=64x128:1;;$C=64x128:1" >$W/cfg_${m}_${n}.txt 2>$W/cfg_${m}_${n}.err
  echo "== M=$m N=$n K=$k rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/cfg_${m}_${n}.err | head -1)"; show $W/cfg_${m}_${n}.txt
done
timeout 30 $B/bench/bench_cuda_linear --m 1,8 --nk 576:2048 --variants mxfp4-group128 --envs ';FINEGEMM_FP4_GEMV=0' >$W/gemv_default.txt 2>&1
echo "== gemv default rc=$?"; show $W/gemv_default.txt
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
