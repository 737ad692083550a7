#!/usr/bin/env bash
# Stop 59, call 1 (H200 wanted; LIMIT=<timeout_s>), binaries of 1e84be2 (stop 58's last code): (1) the grouped lean
# tests with the new default (192-row lean tiles from 96 rows per expert where K or N >= 4096); (2) the new default
# against the general kernel (FINEGEMM_GROUPED_LEAN=0), interleaved, DeepSeek-V3 T = 3072 / 4096 / 6144, with the FP4
# layer at T = 4096 and Qwen3 T = 2048; (3) ncu of the FP4 layer at T = 4096: every kernel's duration (the fold scans'
# share) and the warp-stall samples per SASS instruction of the FP4 lean gate_up; (4) initcheck GroupedLeanSameBits.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-590}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {  # name layer T recipes env...
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 80 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-24s %-14s T=%-5d %-22s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*' >$W/test_lean.txt 2>&1
echo "-- test_cuda_moe *GroupedLean* rc=$? $(el): $(grep -c '^\[       OK' $W/test_lean.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test_lean.txt | head -3 | tr '\n' ' ')"
grep -B2 -A6 "Failure" $W/test_lean.txt | head -30
for round in 1 2; do
  [ $round = 1 ] || left $(( LIMIT - 330 )) || break
  echo "-- round $round $(el)"
  for T in 3072 4096 6144; do
    one dsv3_${T}_new_$round deepseek-v3 $T dynamic X=1
    one dsv3_${T}_l0_$round deepseek-v3 $T dynamic FINEGEMM_GROUPED_LEAN=0
  done
  one dsv3_4096_fp4_$round deepseek-v3 4096 fp4 X=1
  one qwen_2048_new_$round qwen3-30b-a3b 2048 dynamic X=1
  one qwen_2048_l0_$round qwen3-30b-a3b 2048 dynamic FINEGEMM_GROUPED_LEAN=0
done
if left $(( LIMIT - 190 )); then
  R=$W/ncu_all
  timeout 70 ncu --clock-control none --launch-count 30 -f -o $R --metrics gpu__time_duration.sum \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 0 >$R.log 2>&1
  echo "-- ncu all kernels rc=$? $(el)"
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
if left $(( LIMIT - 130 )); then
  R=$W/ncu_gu
  timeout 100 ncu --clock-control none -k "regex:lean" --launch-skip 0 --launch-count 1 -f -o $R \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
    --metrics sm__cycles_elapsed.avg.per_second $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 0 >$R.log 2>&1
  echo "-- ncu FP4 lean gate_up rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
  grep -E "Duration|SM Frequency|Warp Cycles Per Issued|Issue Slots|Executed Ipc" $R.txt | head -8
  python3 ../scripts/sass-stalls ${R}_sass.csv --top 40 2>&1 | head -55
  rm -f $R.ncu-rep
fi
if left $(( LIMIT - 60 )); then
  timeout $(( LIMIT - 15 - ($(date +%s) - s0) )) compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
  echo "-- initcheck GroupedLeanSameBits rc=$? $(el)"; grep -E "ERROR SUMMARY|Uninitialized|at .*cuh:[0-9]+|PASSED|FAILED" $W/initcheck.txt | sort | uniq -c | sort -rn | head -8
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
