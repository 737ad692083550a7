#!/usr/bin/env bash
# Stop 59, call 2 (H200 wanted; LIMIT=<timeout_s>), the binaries of this stop's scale prefetch and scan cache: (1) the
# tests of the grouped lean default (192-row tiles from 96 rows per expert where K or N >= 4096) and of the FP4 lean
# kernels with FINEGEMM_LEAN_SCALE_PREFETCH=1 and FINEGEMM_FP4_SCAN_CACHE=1 (exact against the CPU reference, the
# default's bits); (2) interleaved, two rounds, DeepSeek-V3: the FP4 layer at T = 4096 as it is, with each tile's
# scales prefetched into L2, with the fold scans kept per weight, and with both; the FP8 layer's new default against
# the general kernel (FINEGEMM_GROUPED_LEAN=0) and with the prefetch; the FP4 layer at T = 2048 without and with the
# prefetch; (3) ncu: the FP4 layer's kernel times, and the warp-stall samples per SASS instruction of FP4 gate_up at
# T = 4096 (prefetch on); (4) initcheck of GroupedLeanSameBits.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-590}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {  # name layer T recipes env...
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 80 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-22s %-13s T=%-5d %-20s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
timeout 100 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*' >$W/test_lean.txt 2>&1
echo "-- test_cuda_moe *GroupedLean* rc=$? $(el): $(grep -c '^\[       OK' $W/test_lean.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test_lean.txt | head -3 | tr '\n' ' ')"
grep -B2 -A6 "Failure" $W/test_lean.txt | head -20
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='*ExactLeanKernelExpansion/cuda:*ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/test_fp4.txt 2>&1
echo "-- test_cuda_fp4 lean rc=$? $(el): $(grep -c '^\[       OK' $W/test_fp4.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test_fp4.txt | head -3 | tr '\n' ' ')"
grep -B2 -A6 "Failure" $W/test_fp4.txt | head -20
for round in 1 2; do
  [ $round = 1 ] || left $(( LIMIT - 250 )) || break
  echo "-- round $round $(el)"
  one fp4_4096_pf0_$round deepseek-v3 4096 fp4 X=1
  one fp4_4096_pf1_$round deepseek-v3 4096 fp4 FINEGEMM_LEAN_SCALE_PREFETCH=1
  one fp4_4096_sc1_$round deepseek-v3 4096 fp4 FINEGEMM_FP4_SCAN_CACHE=1
  one fp4_4096_both_$round deepseek-v3 4096 fp4 FINEGEMM_FP4_SCAN_CACHE=1 FINEGEMM_LEAN_SCALE_PREFETCH=1
  one fp8_4096_new_$round deepseek-v3 4096 dynamic X=1
  one fp8_4096_l0_$round deepseek-v3 4096 dynamic FINEGEMM_GROUPED_LEAN=0
  one fp8_4096_pf1_$round deepseek-v3 4096 dynamic FINEGEMM_LEAN_SCALE_PREFETCH=1
  [ $round = 1 ] || continue
  one fp4_2048_pf0_$round deepseek-v3 2048 fp4 X=1
  one fp4_2048_pf1_$round deepseek-v3 2048 fp4 FINEGEMM_LEAN_SCALE_PREFETCH=1
done
if left $(( LIMIT - 215 )) && [ -n "$NCU_ALL" ]; then
  R=$W/ncu_all
  FINEGEMM_LEAN_SCALE_PREFETCH=1 timeout 70 ncu --clock-control none --launch-count 30 -f -o $R --metrics gpu__time_duration.sum \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 0 >$R.log 2>&1
  echo "-- ncu the FP4 layer's kernels (prefetch on) rc=$? $(el)"
  ncu -i $R.ncu-rep --page raw --csv --metrics gpu__time_duration.sum >$R.csv 2>&1
  python3 - $R.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if h is None: print("no table"); sys.exit()
ix = {k: i for i, k in enumerate(rows[h])}
for r in rows[h + 1:]:
    if len(r) == len(rows[h]) and r[ix["Kernel Name"]] != "": print("  %12s  %s" % (r[ix["gpu__time_duration.sum"]], r[ix["Kernel Name"]][:100]))
PY
  rm -f $R.ncu-rep
fi
if left $(( LIMIT - 120 )); then
  R=$W/ncu_gu
  FINEGEMM_LEAN_SCALE_PREFETCH=1 timeout 100 ncu --clock-control none -k "regex:lean" --launch-skip 0 --launch-count 1 -f -o $R \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    --metrics sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 0 >$R.log 2>&1
  echo "-- ncu FP4 lean gate_up (prefetch on) rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
  grep -E "Duration|SM Frequency|DRAM Throughput|dram__bytes|Warp Cycles Per Issued|Issue Slots" $R.txt | head -8
  python3 ../scripts/sass-stalls ${R}_sass.csv --top 30 2>&1 | head -42
  rm -f $R.ncu-rep
fi
if left $(( LIMIT - 50 )); then
  timeout $(( LIMIT - 12 - ($(date +%s) - s0) )) compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
  echo "-- initcheck GroupedLeanSameBits rc=$? $(el)"; grep -E "ERROR SUMMARY|Uninitialized|at .*cuh:[0-9]+|PASSED|FAILED" $W/initcheck.txt | sort | uniq -c | sort -rn | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
