#!/usr/bin/env bash
# Stop 53, call 2 (carry [".snap/prebuilt.txz", ".snap/c2.sh"]; <= ~420 s), binaries of the commit that computes the
# packed tiles' B row once per tile in the FP4 lean kernels. (1) tests: test_cuda_fp4 whole, test_cuda_moe's lean and
# FP4 tests; (2) DeepSeek-V3 layers, event-timed and checked, two rounds: FP8 and FP4 at T = 2048 / 4096 / 16384;
# (3) ncu warp-stall samples of the FP4 grouped lean gate_up at T = 4096 again.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_moe.txt | head -12
for round in 1 2; do
  timeout 150 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096,16384 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- moe round $round rc=$? $(el)"
  grep -h '^{' $W/moe_$round.jsonl | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
done
R=$W/ncu_gu
timeout 120 ncu --clock-control none -k "regex:sm90_fp4_grouped_lean" --launch-skip 0 --launch-count 1 -f -o $R \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
  $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$R.log 2>&1
echo "-- ncu rc=$? $(el)"
ncu -i $R.ncu-rep --page details >$R.txt 2>&1
ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
grep -E "Duration|Warp Cycles Per Issued" $R.txt | head -4
python3 $ROOT/scripts/sass-stalls ${R}_sass.csv --top 16 2>&1 | head -20
rm -f $R.ncu-rep
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
