#!/usr/bin/env bash
# Stop 53, call 9 (carry [".snap/prebuilt.txz", ".snap/c9.sh"]; <= ~150 s), binaries of cc1891e: with the issuing
# thread's fix, the FP4 lean kernel's heights and expansions at T = 4096 (128 rows per expert): the default (192-row
# tiles, batched producers) against 128-row tiles with the consumers expanding (FINEGEMM_FP4_LEAN=128, the default at
# 64-95 rows per expert) and 192-row tiles with the consumers (FINEGEMM_FP4_LEAN_EXPAND=consumers), two rounds.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' $1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
for round in 1 2; do
  timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/def_$round.jsonl 2>&1
  echo "-- round $round default $(el)"; show $W/def_$round.jsonl
  FINEGEMM_FP4_LEAN=128 timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/c128_$round.jsonl 2>&1
  echo "-- round $round 128 consumers $(el)"; show $W/c128_$round.jsonl
  FINEGEMM_FP4_LEAN_EXPAND=consumers timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/c192_$round.jsonl 2>&1
  echo "-- round $round 192 consumers $(el)"; show $W/c192_$round.jsonl
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
