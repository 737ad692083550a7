#!/usr/bin/env bash
# Stop 34 call 5 (carry [".snap"]: prebuilt.txz with the lookahead by default on 192-row tiles only): call 4's one
# failure (Fp4Moe.ExpertsWithCraftedSpreads, rel 0.0107 vs 0.01) rerun on its seed with the lookahead off, default
# and everywhere; LookaheadSameBits and OneAccumulatorSameBits; the shapes that call 4 found slower (64-row tiles,
# 128x192) default vs =1 / =0; then the one-set 128x128 kernels (FINEGEMM_GEMM_ONE_ACC=1) at the 128x128 shapes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
for la in "" 0 1; do
  FINEGEMM_GEMM_LOOKAHEAD=$la FINEGEMM_TEST_SEED=9221622641485425594 timeout 60 $B/tests/test_cuda_fp4 \
    --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/fp4_la$la.log 2>&1
  echo "fp4 crafted spreads, seed of call 4, LOOKAHEAD='$la': rc=$? $(el)"; grep -E "actual|^\[  (PASSED|FAILED)" $W/fp4_la$la.log | head -4
done
timeout 90 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LookaheadSameBits:CudaTest.OneAccumulatorSameBits' >$W/test_lookahead.log 2>&1
echo "LookaheadSameBits rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure" $W/test_lookahead.log | head -4
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-24s ev=%8.2f graph=%8.2f us rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"] or 0, r["rel_err"]))
' $1; }
E=";FINEGEMM_GEMM_LOOKAHEAD=1;FINEGEMM_GEMM_LOOKAHEAD=0;"
for s in 128:24576:1536 16:32768:512 64:32768:512 64:24576:1536 4096:24576:1536; do
  [ $(( $(date +%s) - s0 )) -lt 150 ] || break
  IFS=: read m n k <<<"$s"
  timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs "$E" >$W/ab_${m}_${n}.jsonl 2>/dev/null
  echo "-- $s $(el)"; show $W/ab_${m}_${n}.jsonl
done
O=FINEGEMM_GEMM_ONE_ACC=1
E2=";$O;FINEGEMM_GEMM_CONFIG=128x128:1c2,$O;$O,FINEGEMM_GEMM_LOOKAHEAD=0;;$O"
for s in 512:4096:7168 512:7168:16384 512:7168:2048 4096:4096:7168; do
  [ $(( $(date +%s) - s0 )) -lt 400 ] || break
  IFS=: read m n k <<<"$s"
  timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs "$E2" >$W/oneacc_${m}_${n}_${k}.jsonl 2>/dev/null
  echo "-- one acc $s $(el)"; show $W/oneacc_${m}_${n}_${k}.jsonl
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
