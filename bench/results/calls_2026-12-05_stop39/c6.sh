#!/usr/bin/env bash
# Stop 39, call 6 (carry [".snap"] after scripts/pack-prebuilt): the FP4 lean kernels with a seven-slot packed ring
# (tests, then the dense A/B and the DeepSeek-V3 MoE layer with FP4 experts at each height), the fixed split-finish test,
# the failing crafted-spread seed with the fold off (is its error the data's?), then the 42 shapes against cuBLASLt.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLeanKernelExpansion/cuda' >$W/lean_fp4.log 2>&1
rc=$?; echo "Fp4Linear.ExactLeanKernelExpansion rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|not exact|never took" $W/lean_fp4.log | head -8
for fold in 1 0; do
  FINEGEMM_FP4_FOLD=$fold FINEGEMM_TEST_SEED=17575496020904828288 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/moe_seed$fold.log 2>&1
  echo "Fp4Moe crafted, call 4's seed, FINEGEMM_FP4_FOLD=$fold rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|actual" $W/moe_seed$fold.log | head -6
done
timeout 200 $B/tests/test_cuda_linear --gtest_filter='CudaTest.DecodeSplitFinishSameBits:CudaTest.LeanKernelSameBits:GemmConfig.*' >$W/linear_tests.log 2>&1
echo "DecodeSplitFinishSameBits, LeanKernelSameBits rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Which is|exception" $W/linear_tests.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-16s M=%-5d N=%-6d K=%-6d %-22s ev=%8.2f graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us"], r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
if [ $rc -eq 0 ]; then
  for s in 4096:7168 7168:16384 2112:7168 24576:1536; do
    timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk $s --variants block-fp32-dynamic,mxfp4-group128 \
      --envs ";FINEGEMM_FP4_LEAN=1" >$W/fp4_${s/:/_}.jsonl 2>/dev/null
    echo "-- $s $(el)"; show $W/fp4_${s/:/_}.jsonl
  done
  for e in 0 128 192 256; do
    FINEGEMM_FP4_LEAN=$e timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4,dynamic --check-tokens 1 >$W/moe_fp4_$e.log 2>&1
    echo "-- FINEGEMM_FP4_LEAN=$e $(el)"; grep -vE "^#|^$" $W/moe_fp4_$e.log | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us gate_up+down=%9.1f gemm %6.1f TF" % (r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r["gate_up_us"] + r["down_us"], r["gemm_tflops"]))
    else: print(l.rstrip())'
  done
fi
left=$(( 470 - ($(date +%s) - s0) ))
[ $left -gt 120 ] && timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
grep -E "geomean" $W/linear42.log 2>/dev/null
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
