#!/usr/bin/env bash
# For a session after stop 38 (carry [".snap"] after scripts/pack-prebuilt): the first run of the lean kernels that
# expand FP4 weights in their producer warpgroup (FINEGEMM_FP4_LEAN, written at stop 38 without a GPU). Its tests under
# timeouts (a hang is a barrier-count or parity mistake in the packed ring), then, if they pass, the dense FP4 prefill
# A/B (graph replay, same process and data: the expanded path vs the lean kernel, against FP8 block weights) at
# M = 512 and 4096 over five shapes, then the DeepSeek-V3 MoE layer with FP4 experts at T = 4096 and 2048 (issue 5's
# prefill bar: 85% of the FP8 layer) with the switch unset and at each tile height, the FP8 layer beside them.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLeanKernelExpansion/cuda' >$W/lean_fp4.log 2>&1
rc=$?; echo "Fp4Linear.ExactLeanKernelExpansion rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|not exact|never took" $W/lean_fp4.log | head -12
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/lean_fp4_moe.log 2>&1
mrc=$?; echo "Fp4Moe.ExpertsWithCraftedSpreadsMatchReference rc=$mrc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|FINEGEMM_FP4_LEAN=|bits" $W/lean_fp4_moe.log | head -16
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-16s M=%-5d N=%-6d K=%-6d %-22s ev=%8.2f graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us"], r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
if [ $rc -eq 0 ]; then
  for s in 7168:16384 4096:7168 24576:1536 2112:7168 7168:2048; do
    [ $(( $(date +%s) - s0 )) -lt 330 ] || break
    timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk $s --variants block-fp32-dynamic,mxfp4-group128 \
      --envs ";FINEGEMM_FP4_LEAN=1" >$W/fp4_${s/:/_}.jsonl 2>/dev/null
    echo "-- $s $(el)"; show $W/fp4_${s/:/_}.jsonl
  done
fi
if [ $mrc -eq 0 ]; then
  for e in "FINEGEMM_FP4_LEAN=0" "FINEGEMM_FP4_LEAN=128" "FINEGEMM_FP4_LEAN=192" "FINEGEMM_FP4_LEAN=256"; do
    [ $(( $(date +%s) - s0 )) -lt 520 ] || break
    env $e timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4,dynamic --check-tokens 1 >$W/moe_fp4.log 2>&1
    echo "-- $e $(el)"; grep -vE "^#|^$" $W/moe_fp4.log | tail -6
  done
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
