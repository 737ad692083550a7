#!/usr/bin/env bash
# Stop 54, call 5 (carry [".snap/prebuilt.txz", ".snap/prebuilt_old.txz", ".snap/c5.sh"]; <= ~360 s). Call 4's ring
# trace split producer thread 0's issuing: A's TMA ~120 cycles, issue_packed ~640 (the packed tile's TMA issued
# right after A's), per K block, on the warp every stage waits for. This build issues the packed tile before the
# stage's empty wait (the previous row expanded meanwhile), not beside A's TMA. prebuilt_old.txz: bench_cuda_moe of 26a19a5
# (both at the stage's start). (1) tests: test_cuda_fp4's lean / scan / crafted-spread tests, test_cuda_moe's lean
# and FP4 tests; (2) the ring trace of gate_up at T = 4096 in the new order; (3) the DeepSeek-V3 FP8 and FP4 layers
# at T = 4096, new against old binaries, three rounds interleaved (same recipes per process, so the same data);
# (4) T = 16384 once each (the FP4 layer's expanded path there: a control).
cd "$(dirname "$0")"
mkdir -p .prebuilt .prebuilt_old && tar xJf prebuilt.txz -C .prebuilt && tar xJf prebuilt_old.txz -C .prebuilt_old
B=.prebuilt; O=.prebuilt_old; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gate_up %8.1f  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("gate_up_us", 0), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*:*CraftedSpread*' >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 lean/scan/crafted rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_moe.txt | head -12
FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring_new.txt FINEGEMM_FP4_LEAN_TRACE_CALL=4 timeout 100 \
  $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring_new.jsonl 2>$W/ring_new.err
echo "-- ring trace gate_up, packed before the empty wait rc=$? $(el)"
python3 $ROOT/scripts/fp4-lean-ring $W/ring_new.txt --mhz 1980 2>&1 | head -24
for round in 1 2 3; do
  for side in new old; do
    X=$B; [ $side = old ] && X=$O
    timeout 60 $X/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/${side}_$round.jsonl 2>$W/${side}_$round.err
    echo "-- $side round $round rc=$? $(el)"; show $W/${side}_$round.jsonl
  done
done
for side in new old; do
  X=$B; [ $side = old ] && X=$O
  timeout 100 $X/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic,fp4 --check-tokens 1 >$W/${side}_16k.jsonl 2>$W/${side}_16k.err
  echo "-- $side T=16384 rc=$? $(el)"; show $W/${side}_16k.jsonl
done
gzip -f $W/ring_*.txt
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
