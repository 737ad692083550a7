#!/usr/bin/env bash
# For the session after stop 36 (carry [".snap"] after scripts/pack-prebuilt): the first runs of the 192-row lean
# tile (FINEGEMM_GEMM_LEAN=192) and of the lean kernel's grouped mode (FINEGEMM_GROUPED_LEAN=128/192/256), both
# written at the end of stop 36. Their same-bits tests under timeouts (a hang is a barrier mismatch), then
# LEAN=0/1/192/256 at M = 512 and 4096 on the seven bar shapes (same process and data), then the MoE layer with each
# grouped setting, then the 42 shapes against cuBLASLt if time is left.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits:GemmConfig.*' >$W/lean_test.log 2>&1
rc=$?; echo "LeanKernelSameBits rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|lean kernel did not|took the lean" $W/lean_test.log | head -12
timeout 200 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.GroupedLeanSameBits' >$W/grouped_lean_test.log 2>&1
grc=$?; echo "GroupedLeanSameBits rc=$grc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|did not both|yet took" $W/grouped_lean_test.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-10s ev=%8.2f graph=%8.2f us %7.1f TF rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"] or 0, r["tflops"], r["rel_err"]))
' $1; }
if [ $rc -eq 0 ]; then
  E="FINEGEMM_GEMM_LEAN=0;FINEGEMM_GEMM_LEAN=1;FINEGEMM_GEMM_LEAN=192;FINEGEMM_GEMM_LEAN=256"
  for s in 2112:7168 576:7168 4096:7168 7168:16384 24576:1536 32768:512 7168:2048; do
    [ $(( $(date +%s) - s0 )) -lt 300 ] || break
    timeout 80 $B/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk $s --variants block-fp32-dynamic --envs "$E" >$W/ab_${s/:/_}.jsonl 2>/dev/null
    echo "-- $s $(el)"; show $W/ab_${s/:/_}.jsonl
  done
fi
if [ $grc -eq 0 ]; then
  for v in 0 128 192 256; do
    [ $(( $(date +%s) - s0 )) -lt 420 ] || break
    FINEGEMM_GROUPED_LEAN=$v timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 2048,4096 --recipes dynamic --check-tokens 1 >$W/moe_lean$v.log 2>&1
    echo "-- FINEGEMM_GROUPED_LEAN=$v $(el)"; grep -vE "^#|^$" $W/moe_lean$v.log | tail -6
  done
fi
left=$(( 585 - ($(date +%s) - s0) ))
[ $left -gt 120 ] && timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
grep -E "geomean" $W/linear42.log 2>/dev/null
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
