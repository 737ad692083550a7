#!/usr/bin/env bash
# Stop 54, call 7 (carry [".snap/prebuilt.txz", ".snap/c7.sh"]; <= ~300 s): the binaries that land (the packed ring
# back at 7; the FP4 lean kernel's default path as in calls 2-4). (1) test_cuda_fp4 whole in three shards, and the
# crafted-spread MoE test with call 6's seed (its FP32-scale interleaved case: every GPU path at rel 0.0116 against a
# 0.01 bar), test_cuda_moe's lean and FP4 tests, the switch tests; (2) the DeepSeek-V3 FP8 and FP4 layers at T = 2048
# and 4096, two rounds.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gate_up %8.1f  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("gate_up_us", 0), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 0 1 2; do
  GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 200 $B/tests/test_cuda_fp4 >$W/test_fp4_$i.txt 2>&1 &
done
wait; echo "-- test_cuda_fp4 whole, three shards $(el)"
grep -hE "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|seed" $W/test_fp4_*.txt | head -16
FINEGEMM_TEST_SEED=18343406184352838198 timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='*CraftedSpread*' >$W/test_fp4_seed.txt 2>&1; echo "-- crafted spread, call 6's seed rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|actual" $W/test_fp4_seed.txt | head -8
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_moe.txt | head -8
timeout 60 $B/tests/test_cuda_linear --gtest_filter='*Switch*' >$W/test_switch.txt 2>&1; echo "-- switch tests rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/test_switch.txt | head -4
for round in 1 2; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- round $round rc=$? $(el)"; show $W/moe_$round.jsonl
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
