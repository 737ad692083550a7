#!/usr/bin/env bash
# Stop 53, call 8 (carry [".snap/prebuilt.txz", ".snap/c8.sh"]; <= ~260 s), binaries of cc1891e (the staged fold
# scan by default from 32 K blocks per row): (1) tests: test_cuda_fp4 whole, test_cuda_moe's lean and FP4 tests, the
# switch test, `finegemm check --backend cuda`; (2) ncu per kernel, DeepSeek-V3 FP4 T = 4096; (3) DeepSeek-V3 FP8 and
# FP4 layers at T = 4096, three rounds, event-timed and checked.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1 &
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1 &
wait
timeout 60 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/test_switch.txt 2>&1
timeout 200 $B/tools/finegemm check --backend cuda >$W/check.txt 2>&1
echo "-- tests $(el)"
for f in test_fp4 test_moe test_switch; do echo "$f: $(grep -hE '^\[  (PASSED|FAILED)  \]' $W/$f.txt | tr '\n' ' ')"; grep -hE "^\[  FAILED  \]|Failure" $W/$f.txt | head -6; done
tail -1 $W/check.txt
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
