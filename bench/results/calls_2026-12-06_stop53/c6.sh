#!/usr/bin/env bash
# Stop 53, call 6 (carry [".snap/prebuilt.txz", ".snap/c6.sh"]; <= ~330 s), binaries of HEAD after 52c7603 (the packed tiles' B
# row once per tile; the rows scan with lanes sized to the row and 16 loads in flight). (1) tests: test_cuda_fp4
# whole (the new Fp4Scan test included), test_cuda_moe's lean and FP4 tests; (2) ncu per kernel, DeepSeek-V3 FP4
# T = 4096 (the scans' times); (3) DeepSeek-V3 layers, event-timed and checked, three rounds: FP8 and FP4 at T = 4096,
# with the rows scan's unroll by row length (8 from 32 K blocks, 16 below) and the Fp4Scan test's fixed self-check.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Fp4Scan" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1 &
timeout 200 $B/tools/finegemm check --backend cuda >$W/check.txt 2>&1 &
wait; echo "-- test_cuda_moe lean/fp4 and finegemm check $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_moe.txt | head -12; tail -3 $W/check.txt
timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 14 \
  $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ncu.csv 2>$W/ncu.err
echo "-- ncu $(el)"
python3 - $W/ncu.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
    if us > 20: print("  %10.1f us  %s" % (us, r[ki][:90]))
PY
show() { grep -h '^{' $1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
for round in 1 2 3; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/t4096_$round.jsonl 2>&1
  echo "-- round $round $(el)"; show $W/t4096_$round.jsonl
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
