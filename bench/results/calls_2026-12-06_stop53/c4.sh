#!/usr/bin/env bash
# Stop 53, call 4 (carry [".snap/prebuilt.txz", ".snap/c4.sh"]; <= ~300 s), binaries of e486c25 (the packed tiles'
# B row once per tile; FINEGEMM_FP4_LEAN_EXPAND=early). (1) tests: the switch test, the FP4 MoE crafted-spread test
# (every height and mode, early included), the dense lean-expansion test; (2) DeepSeek-V3 FP4 layer at T = 2048 / 4096
# batched (default) vs early, three rounds, FP8 T = 4096 once per round; (3) ncu per kernel at T = 4096 for both.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/test_switch.txt 2>&1
echo "-- switch test rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/test_switch.txt | head -4
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='*Moe*:*Lean*' >$W/test_fp4.txt 2>&1
echo "-- test_cuda_fp4 Moe/Lean rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_fp4.txt | head -12
show() { grep -h '^{' $1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
for round in 1 2 3; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/fp8_$round.jsonl 2>&1
  echo "-- round $round FP8 $(el)"; show $W/fp8_$round.jsonl
  for mode in batched early; do
    FINEGEMM_FP4_LEAN_EXPAND=$mode timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4 --check-tokens 1 >$W/fp4_${round}_$mode.jsonl 2>&1
    echo "-- round $round FP4 $mode $(el)"; show $W/fp4_${round}_$mode.jsonl
  done
done
for mode in batched early; do
  FINEGEMM_FP4_LEAN_EXPAND=$mode timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 14 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ncu_$mode.csv 2>$W/ncu_$mode.err
  echo "-- ncu $mode $(el)"
  python3 - $W/ncu_$mode.csv <<'PY'
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
