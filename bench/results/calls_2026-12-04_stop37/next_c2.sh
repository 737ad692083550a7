#!/usr/bin/env bash
# For the session after stop 37, its second call (carry [".snap"] after scripts/pack-prebuilt; the first call is
# calls_2026-12-04_stop36/next_c1.sh): the first run of the decode split-K finished in the kernel
# (FINEGEMM_DECODE_SPLIT_FINISH=1, stop 37). Its two same-bits tests under timeouts (a hang is a counter or barrier
# mismatch), then the dense decode A/B (graph replay, same process and data) at M = 1, 16, 64 over the seven shapes,
# E4M3 and MXFP4 weights, then the MoE layer at T = 1 and 16 (DeepSeek-V3, dynamic and FP4) with the switch off and on,
# and the decode split with the finish at forced splits (the split heuristic counts a reduce kernel that the finish
# removes), then the grouped lean tests of branch work merged before packing, if time is left.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.DecodeSplitFinishSameBits' >$W/finish_linear.log 2>&1
rc=$?; echo "linear DecodeSplitFinishSameBits rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|did not finish" $W/finish_linear.log | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.DecodeSplitFinishSameBits' >$W/finish_moe.log 2>&1
mrc=$?; echo "MoE DecodeSplitFinishSameBits rc=$mrc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|did not both" $W/finish_moe.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-16s M=%-3d N=%-6d K=%-6d %-32s ev=%7.2f graph=%7.2f us %6.0f GB/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us"], r["us_graph"] or 0, r.get("gbps", 0) or 0, r["rel_err"]))
' $1; }
if [ $rc -eq 0 ]; then
  E=";FINEGEMM_DECODE_SPLIT_FINISH=1"
  for s in 4096:7168 24576:1536 7168:16384 2112:7168 576:7168 7168:2048 32768:512; do
    [ $(( $(date +%s) - s0 )) -lt 280 ] || break
    timeout 60 $B/bench/bench_cuda_linear --m 1,16,64 --nk $s --variants block-fp32-dynamic,mxfp4-group32 --envs "$E" >$W/dec_${s/:/_}.jsonl 2>/dev/null
    echo "-- $s $(el)"; show $W/dec_${s/:/_}.jsonl
  done
fi
if [ $mrc -eq 0 ]; then
  for e in "FINEGEMM_DECODE_SPLIT_FINISH=0" "FINEGEMM_DECODE_SPLIT_FINISH=1" "FINEGEMM_DECODE_SPLIT_FINISH=1 FINEGEMM_FP4_DECODE_SPLIT=2" "FINEGEMM_DECODE_SPLIT_FINISH=1 FINEGEMM_FP4_DECODE_SPLIT=4"; do
    [ $(( $(date +%s) - s0 )) -lt 470 ] || break
    env $e timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_dec.log 2>&1
    echo "-- $e $(el)"; grep -vE "^#|^$" $W/moe_dec.log | tail -6
  done
fi
left=$(( 585 - ($(date +%s) - s0) ))
[ $left -gt 30 ] && timeout $left $B/tests/test_cuda_moe --gtest_filter='CudaMoe.GroupedLean*' >$W/grouped_lean2.log 2>&1
echo "grouped lean tests rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure" $W/grouped_lean2.log | head -8
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
