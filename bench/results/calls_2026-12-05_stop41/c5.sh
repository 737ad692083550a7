#!/usr/bin/env bash
# Stop 41, call 5 (carry [".snap"] after scripts/pack-prebuilt, after c4.sh; ~5 min): the permuted FP4 decode kernel's
# 128-token tiles at prefill sizes and the sanitizers on it.
# (4) DeepSeek-V3 FP4 experts at T = 2048 and 4096 (64 and 128 rows per expert: 128-token tiles) with the decode path forced (FINEGEMM_MOE_DECODE=1
#     FINEGEMM_FP4_DECODE_PERM=1: chunks of 128 tokens per expert, the weights expanded in registers) against the FP4
#     default (the lean kernel) and the FP8 layer: issue 5's MoE prefill bar (85% of FP8 at T = 4096; stop 39: 53%).
# (5) compute-sanitizer memcheck and racecheck on the permuted kernel (dense quick and the MoE's 128-token tiles).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"]))
    else: print(l.rstrip()[:200])'; }
# (4) Prefill sizes on the permuted decode kernel's 128-token tiles (FINEGEMM_MOE_DECODE=1 FINEGEMM_FP4_DECODE_PERM=1)
#     against the FP4 default (lean kernel) and the FP8 layer: issue 5's MoE prefill bar (85% of FP8 at T = 4096).
for e in "FINEGEMM_FP4_DECODE_PERM=0" "FINEGEMM_MOE_DECODE=1 FINEGEMM_FP4_DECODE_PERM=1"; do
  env $e timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4 --check-tokens 1 >$W/moep_${e##*=}.log 2>&1
  echo "-- DeepSeek-V3 FP4 experts T = 2048, 4096: $e $(el)"; showmoe $W/moep_${e##*=}.log
done
timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes dynamic --check-tokens 1 >$W/moep_fp8.log 2>&1
echo "-- DeepSeek-V3 FP8 experts T = 2048, 4096 $(el)"; showmoe $W/moep_fp8.log
# (5) memcheck and racecheck on the permuted kernel (dense quick and the MoE's 128-token tiles).
for tool in memcheck racecheck; do
  FINEGEMM_TEST_QUICK=1 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda_fp4 \
    --gtest_filter='Backends/Fp4Linear.ExactPermutedDecode/cuda:Backends/Fp4Moe.PermutedDecodeWideTokenTiles/cuda' >$W/san_$tool.log 2>&1
  echo "-- $tool rc=$? $(grep -E 'SUMMARY' $W/san_$tool.log | tail -1) $(el)"
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
