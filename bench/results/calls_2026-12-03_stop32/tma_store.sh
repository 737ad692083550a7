#!/usr/bin/env bash
# Branch exp/tma-store (carry [".snap"]; prebuilt.txz built from the branch, prebuilt_old.txz from main): the
# TMA-store epilogue's test, memcheck and racecheck on it, then FINEGEMM_GEMM_TMA_STORE=1 against the default on the
# same data (the switch forces nothing else: it applies where the heuristic picks 192x128 pairs or 128x128 alone), and the
# branch's default against main's (the new kernel parameter and instantiation must not slow the default).
cd "$(dirname "$0")"
mkdir -p .pn .po && tar xJf prebuilt.txz -C .pn && tar xJf prebuilt_old.txz -C .po
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 200 .pn/tests/test_cuda_linear --gtest_filter='CudaTest.TmaStoreSameBits' >$W/test.log 2>&1
echo "TmaStoreSameBits rc=$? $(el)"; grep -E "OK \]|FAILED|Failure|Expected|Which is" $W/test.log | head -12
for tool in memcheck racecheck; do
  FINEGEMM_GEMM_TMA_STORE=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 .pn/tests/test_cuda_linear \
    --gtest_filter='CudaTest.TmaStoreSameBits' >$W/san_$tool.log 2>&1
  echo "$tool rc=$? $(el) $(grep -E 'SUMMARY' $W/san_$tool.log | tail -1)"
done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-4s M=%-4d N=%-6d K=%-6d env=%-16s graph=%8.2f us rel=%.2e" % (sys.argv[2], r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us_graph"], r["rel_err"]))
' $1 $2; }
T=FINEGEMM_GEMM_TMA_STORE
for s in 4096:32768:512 512:24576:1536 512:32768:512 4096:24576:1536 512:7168:2048 4096:7168:2048 512:4096:7168 4096:4096:7168 4096:7168:16384; do
  [ $(( $(date +%s) - s0 )) -lt 470 ] || break
  IFS=: read -r m n k <<<"$s"
  timeout 60 .pn/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs ";$T=1;;$T=1" >$W/ab_${m}_${n}_${k}.txt 2>&1
  timeout 40 .po/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic >$W/main_${m}_${n}_${k}.txt 2>&1
  echo "== M=$m N=$n K=$k $(el)"; show $W/ab_${m}_${n}_${k}.txt new; show $W/main_${m}_${n}_${k}.txt main
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
