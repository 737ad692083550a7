#!/usr/bin/env bash
# Stop 53, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~300 s): FINEGEMM_FP4_LEAN_A_PREFETCH=1 (A's tile
# into L2 with each packed load, as far ahead as the packed ring runs). (1) the FP4 tests that run the lean kernels,
# with the switch; (2) DeepSeek-V3 FP4 layer at T = 2048 / 4096, off / on, three rounds, and FP8 once per round;
# (3) ncu per kernel at T = 4096, off and on.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
FINEGEMM_FP4_LEAN_A_PREFETCH=1 timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='*Moe*:*Lean*' >$W/test_fp4_pf.txt 2>&1
echo "-- test_cuda_fp4 Moe/Lean with the prefetch rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_fp4_pf.txt | head -12
show() { grep -h '^{' $1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
for round in 1 2 3; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/fp8_$round.jsonl 2>&1
  echo "-- round $round FP8 $(el)"; show $W/fp8_$round.jsonl
  for pf in 0 1; do
    FINEGEMM_FP4_LEAN_A_PREFETCH=$pf timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4 --check-tokens 1 >$W/fp4_${round}_$pf.jsonl 2>&1
    echo "-- round $round FP4 prefetch=$pf $(el)"; show $W/fp4_${round}_$pf.jsonl
  done
done
for pf in 0 1; do
  FINEGEMM_FP4_LEAN_A_PREFETCH=$pf timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 14 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ncu_$pf.csv 2>$W/ncu_$pf.err
  echo "-- ncu prefetch=$pf $(el)"
  python3 - $W/ncu_$pf.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
    if us > 20: print("  %10.1f us  %s" % (us, r[ki][:90]))
PY
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
