#!/usr/bin/env bash
# Stop 54, call 7 (carry [".snap/prebuilt.txz", ".snap/c7.sh"]; <= ~330 s): the binaries that land (the packed ring
# back at 7; the FP4 lean kernel's default path as in calls 2-4), on whatever card comes (an H200 is offered after a
# failed start). In order of value: (1) the DeepSeek-V3 FP8 and FP4 layers at T = 4096, three rounds (issue 4's and
# issue 5's MoE prefill rows); (2) dense prefill M = 4096, N = 4096 K = 7168 and N = 7168 K = 16384, FP4 against FP8,
# two rounds, graph replay (issue 3's and issue 5's rows); (3) the layers at T = 16384 once; (4) tests: the
# crafted-spread MoE test with call 6's seed, the scans, test_cuda_moe's lean and FP4 tests; test_cuda_fp4 whole in
# three shards.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gate_up %8.1f  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("gate_up_us", 0), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for round in 1 2 3; do
  timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- T=4096 round $round rc=$? $(el)"; show $W/moe_$round.jsonl
done
for rep in 1 2; do
  timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
done
echo "-- dense prefill $(el)"; cat $W/dense_*.jsonl | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%d N=%d K=%d %-18s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'
timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_16k.jsonl 2>$W/moe_16k.err
echo "-- T=16384 rc=$? $(el)"; show $W/moe_16k.jsonl
FINEGEMM_TEST_SEED=18343406184352838198 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*CraftedSpread*:Fp4Scan*' >$W/test_fp4_seed.txt 2>&1; echo "-- crafted spread (call 6's seed) and scans rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|actual" $W/test_fp4_seed.txt | head -8
timeout 90 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" $W/test_moe.txt | head -6
for i in 0 1 2; do
  GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 150 $B/tests/test_cuda_fp4 >$W/test_fp4_$i.txt 2>&1 &
done
wait; echo "-- test_cuda_fp4 whole, three shards $(el)"
grep -hE "^\[  (PASSED|FAILED) |FAILED  \]|actual" $W/test_fp4_*.txt | head -12
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
