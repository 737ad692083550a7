#!/usr/bin/env bash
# Written at stop 46 (no device was lent for it; the next session's first call; carry [".snap/prebuilt.txz",
# ".snap/c2.sh"] after scripts/pack-prebuilt; <= ~540 s): prepared fold words (FINEGEMM_FP4_DECODE_FOLD_CACHE=1: the
# preparer warp idle; =2: no preparer warp, 7 stages, five CTAs per SM at WN = 8): the test, then the A/B against the
# default at M = 1, 16, 32, 64 on the two >= 28 MB shapes, twice; issue 3's decode shapes with and without
# --weights-static (FP8), FP4 with it; then the FP4 crafted tests that cover the decode kernel's default paths.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-4d N=%-6d K=%-6d %-34s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
timeout 120 $B/tests/test_cuda_fp4 --gtest_filter='*ExactPreparedFoldWords*:*PermutedDecodePreparedFoldWordsSameBits*' >$W/fp4_pre.log 2>&1
echo "test rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|never|not exact" $W/fp4_pre.log | head -8; tail -n 1 $W/fp4_pre.log
for rep in 1 2; do
  if left 200; then
    timeout 110 $B/bench/bench_cuda_linear --m 1,16,32,64 --nk 7168:16384,4096:7168 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_FOLD_CACHE=1;FINEGEMM_FP4_DECODE_FOLD_CACHE=2" >$W/fold_$rep.jsonl 2>$W/fold_$rep.err
    echo "-- FP4 decode default / prepared fold words, run $rep $(el)"; show $W/fold_$rep.jsonl
  fi
done
# Issue 3's decode bar shapes with and without the serving promise (RunOptions::weights_static: the kernel ahead
# does not write the weights, so the decode kernel requests its first weight tiles before it waits), FP8 and FP4.
if left 200; then
  timeout 50 $B/bench/bench_cuda_linear --m 1,16,64 --nk 7168:16384,24576:1536,4096:7168 --variants block-fp32-dynamic >$W/fp8.jsonl 2>$W/fp8.err
  echo "-- FP8, pre-quantized input $(el)"; show $W/fp8.jsonl
fi
if left 250; then
  timeout 50 $B/bench/bench_cuda_linear --weights-static --m 1,16,64 --nk 7168:16384,24576:1536,4096:7168 --variants block-fp32-dynamic >$W/fp8_static.jsonl 2>$W/fp8_static.err
  echo "-- FP8, weights_static $(el)"; show $W/fp8_static.jsonl
fi
if left 300; then
  timeout 50 $B/bench/bench_cuda_linear --weights-static --m 1,16,64 --nk 7168:16384,4096:7168 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_FOLD_CACHE=2;FINEGEMM_PDL=1,FINEGEMM_FP4_DECODE_FOLD_CACHE=2" >$W/fp4_static.jsonl 2>$W/fp4_static.err
  echo "-- FP4, weights_static $(el)"; show $W/fp4_static.jsonl
fi
# The MoE decode path (DeepSeek-V3 FP4 experts, T = 1 and 16, permuted kernel) with and without the prepared words.
if left 330; then
  for e in FINEGEMM_FP4_DECODE_FOLD_CACHE=0 FINEGEMM_FP4_DECODE_FOLD_CACHE=1; do
    env $e timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes fp4 --check-tokens 1 >$W/moe_${e##*=}.log 2>&1
    echo "-- MoE decode FP4, $e $(el)"; grep -hE '^\{' $W/moe_${e##*=}.log | cut -c1-240 | head -4
  done
fi
if left 380; then
  timeout 120 $B/tests/test_cuda_fp4 --gtest_filter='*ExactDecodePathsSmall*:*ExactFoldSpreads*:*ExactRandomSpreadsWithKTail*:*ExactPipelinedDecode*' >$W/fp4_def.log 2>&1
  echo "default-path tests rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure" $W/fp4_def.log | head -8; tail -n 1 $W/fp4_def.log
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
