#!/usr/bin/env bash
# Stop 53, call 7 (carry [".snap/prebuilt.txz", ".snap/c7.sh"]; <= ~200 s): FINEGEMM_FP4_SCAN_STAGED=1 (the fold scan
# with each tile's scales staged by one bulk copy). (1) the Fp4Scan test and the switch test; (2) ncu per kernel,
# DeepSeek-V3 FP4 T = 4096, off and on; (3) the FP4 layer at T = 4096 off / on, three rounds, and FP8 once a round.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='Fp4Scan*' >$W/test_scan.txt 2>&1; echo "-- Fp4Scan rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|Which is|trace|K = " $W/test_scan.txt | head -16
timeout 60 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/test_switch.txt 2>&1
echo "-- switch test rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $W/test_switch.txt | head -4
for st in 0 1; do
  FINEGEMM_FP4_SCAN_STAGED=$st timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 14 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ncu_$st.csv 2>$W/ncu_$st.err
  echo "-- ncu staged=$st $(el)"
  python3 - $W/ncu_$st.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
    if us > 20 and "scan" in r[ki]: print("  %10.1f us  %s" % (us, r[ki][:90]))
PY
done
show() { grep -h '^{' $1 | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
for round in 1 2 3; do
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$W/fp8_$round.jsonl 2>&1
  echo "-- round $round FP8 $(el)"; show $W/fp8_$round.jsonl
  for st in 0 1; do
    FINEGEMM_FP4_SCAN_STAGED=$st timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/fp4_${round}_$st.jsonl 2>&1
    echo "-- round $round FP4 staged=$st $(el)"; show $W/fp4_${round}_$st.jsonl
  done
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
