#!/usr/bin/env bash
# For the session after stop 35 (carry [".snap"] after scripts/pack-prebuilt): the lean kernels' first run. Their
# same-bits test under a timeout (a hang there is a barrier mismatch), then, if it passes, the lean kernels against the
# general 128x128 tile and the default at the shapes of issue 3's bars, same process and data; then the memory-pattern
# bench and the MoE decode profile.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 120 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits' >$W/lean_test.log 2>&1
rc=$?; echo "LeanKernelSameBits rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|lean kernel did not" $W/lean_test.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-34s ev=%8.2f graph=%8.2f us %7.1f TF rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"] or 0, r["tflops"], r["rel_err"]))
' $1; }
if [ $rc -eq 0 ]; then
  E=";FINEGEMM_GEMM_LEAN=1;FINEGEMM_GEMM_LEAN=256;FINEGEMM_GEMM_CONFIG=128x128:1;"
  for s in 4096:7168:16384 4096:4096:7168 4096:7168:2048 4096:24576:1536 512:4096:7168 512:7168:16384 512:7168:2048; do
    [ $(( $(date +%s) - s0 )) -lt 420 ] || break
    IFS=: read m n k <<<"$s"
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs "$E" >$W/lean_${m}_${n}_${k}.jsonl 2>/dev/null
    echo "-- $s $(el)"; show $W/lean_${m}_${n}_${k}.jsonl
  done
fi
left=$(( 570 - ($(date +%s) - s0) ))
[ $left -gt 60 ] && OUT=$W/gc GPU_CHECK_DEADLINE=$left timeout $left scripts/gpu-check bench-dram-pattern profile-moe-decode >$W/gc.log 2>&1
tail -8 $W/gc.log 2>/dev/null
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
