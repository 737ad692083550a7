#!/usr/bin/env bash
# Stop 52, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~500 s), binaries of 10a75d8: the FP4 fold scan
# along the scale rows (default for grouped expansions and scan-only calls), the grouped lean kernel by default from
# 256 rows per expert (gated for the expanded FP4 experts). (1) tests: test_cuda_fp4 whole, test_cuda_moe's lean and
# FP4-related tests; (2) ncu per launch: DeepSeek-V3 FP4 T = 16384 and 4096 (default, and the earlier scans:
# FINEGEMM_FP4_EXPAND_WIDE=0 at 16384, =2 at 4096); (3) layer A/B, three rounds: FP8 T = 4096 / 8192 / 16384 default
# vs FINEGEMM_GROUPED_LEAN=0; FP4 T = 4096 default vs =2, T = 16384 default vs FINEGEMM_FP4_EXPAND_WIDE=0 and vs
# FINEGEMM_GROUPED_LEAN=0.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_moe.txt | head -12
ncu1() {  # tag, tokens, recipe, env
  env $4 timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 16 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens $2 --recipes $3 --check-tokens 1 >$W/ncu_$1.csv 2>$W/ncu_$1.err
  echo "-- ncu $1 ($2 $3 $4) $(el)"
  python3 - $W/ncu_$1.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u in ("nsecond", "ns") else v * 1000 if u in ("msecond", "ms") else v
    if us > 5: print("  %10.1f us  %s" % (us, r[ki][:100]))
PY
}
if left 330; then ncu1 fp4_16k 16384 fp4 FINEGEMM_NOTHING=1; fi
if left 350; then ncu1 fp4_4k 4096 fp4 FINEGEMM_NOTHING=1; fi
if left 370; then ncu1 fp4_4k_w2 4096 fp4 FINEGEMM_FP4_EXPAND_WIDE=2; fi
moe() {  # tag, tokens, recipes, env
  env $4 timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens $2 --recipes $3 --check-tokens 1 >$W/moe_$1.log 2>&1
  grep -h '^{' $W/moe_$1.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-30s %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % ("'"$4"'", r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail|terminate" $W/moe_$1.log | head -3
}
for rep in 1 2 3; do
  if left 420; then moe fp8_${rep} 4096,8192,16384 dynamic FINEGEMM_NOTHING=1; fi
  if left 430; then moe fp8off_${rep} 4096,8192,16384 dynamic FINEGEMM_GROUPED_LEAN=0; fi
  if left 440; then moe fp4_${rep} 4096,16384 fp4 FINEGEMM_NOTHING=1; fi
  if left 450; then moe fp4w2_${rep} 4096 fp4 FINEGEMM_FP4_EXPAND_WIDE=2; fi
  if left 460; then moe fp4w0_${rep} 16384 fp4 FINEGEMM_FP4_EXPAND_WIDE=0; fi
  if left 470; then moe fp4off_${rep} 16384 fp4 FINEGEMM_GROUPED_LEAN=0; fi
  echo "-- round $rep $(el)"
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
