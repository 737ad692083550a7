#!/usr/bin/env bash
# Stop 60, call 1 (H200 wanted; LIMIT=<timeout_s>), the binaries of 72996a1 (stop 59's): (1) issue 5's MoE prefill
# ratio on the bars' card, DeepSeek-V3 T = 4096, the FP8 layer against the FP4 layer as it is and with the kept fold
# scans (FINEGEMM_FP4_SCAN_CACHE=1, what RunOptions::weights_constant does), interleaved rounds; (2) dense decode, FP8
# against FP4, M = 1 / 16 / 64 (graph replay); (3) ncu of the dense FP4 decode at M = 1 N = 7168 K = 16384, plain and
# permuted (FINEGEMM_FP4_DECODE_PERM=1): every kernel's time, then one decode launch's warp states and per-SASS stalls.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-450}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 40 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-14s T=%-5d %-20s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
for round in $(seq 1 ${ROUNDS:-3}); do
  left $(( LIMIT - 260 )) || break
  echo "-- round $round $(el)"
  one fp8_$round deepseek-v3 4096 dynamic X=1
  one fp4_$round deepseek-v3 4096 fp4 X=1
  one fp4_sc1_$round deepseek-v3 4096 fp4 FINEGEMM_FP4_SCAN_CACHE=1
done
echo "-- dense decode $(el)"
timeout 90 $B/bench/bench_cuda_linear --m 1,16,64 --nk 7168:16384,4096:7168 --variants block-fp32-dynamic,mxfp4-group128 >$W/decode.jsonl 2>$W/decode.err
grep -h '^{' $W/decode.jsonl | python3 -c 'import json,sys
for l in sys.stdin:
  r=json.loads(l); print("  " + " ".join("%s=%s" % (k, r[k]) for k in ("variant","m","n","k","us","us_graph","rel_err") if k in r))'
echo "-- FP4 decode A/B: default, 256 of K per stage (128-byte rows), permuted $(el)"
timeout 80 $B/bench/bench_cuda_linear --m 1,16 --nk 7168:16384,4096:7168 --variants mxfp4-group128 --envs ';FINEGEMM_FP4_DECODE_STAGE_K=256;FINEGEMM_FP4_DECODE_PERM=1' >$W/decode_ab.jsonl 2>$W/decode_ab.err
grep -h '^{' $W/decode_ab.jsonl | python3 -c 'import json,sys
for l in sys.stdin:
  r=json.loads(l); print("  " + " ".join("%s=%s" % (k, r[k]) for k in ("variant","env","envs","m","n","k","us","us_graph","rel_err") if k in r))'
for perm in 0 1; do
  left $(( LIMIT - 70 )) || break
  R=$W/ncu_p$perm
  FINEGEMM_FP4_DECODE_PERM=$perm timeout 60 ncu --clock-control none -k "regex:decode|quant|reduce" --launch-skip 10 --launch-count 6 -f -o ${R}_t \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum \
    $B/bench/bench_cuda_linear --m 1 --nk 7168:16384 --variants mxfp4-group128 >${R}_t.log 2>&1
  echo "-- ncu perm=$perm kernel times rc=$? $(el)"
  ncu -i ${R}_t.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum 2>&1 | python3 -c '
import csv,sys
rows=list(csv.reader(sys.stdin)); h=next((i for i,r in enumerate(rows) if "Kernel Name" in r),None)
if h is None: print("no table"); sys.exit()
ix={k:i for i,k in enumerate(rows[h])}
for r in rows[h+1:]:
  if len(r)==len(rows[h]) and r[ix["Kernel Name"]]: print("  %10s ns dram %6s%% inst %12s  %s" % (r[ix["gpu__time_duration.sum"]], r[ix["dram__throughput.avg.pct_of_peak_sustained_elapsed"]], r[ix["smsp__inst_executed.sum"]], r[ix["Kernel Name"]][:90]))'
  rm -f ${R}_t.ncu-rep
  left $(( LIMIT - 45 )) || break
  FINEGEMM_FP4_DECODE_PERM=$perm timeout 60 ncu --clock-control none -k "regex:sm90_fp4_decode" --launch-skip 4 --launch-count 1 -f -o $R \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters --import-source no \
    $B/bench/bench_cuda_linear --m 1 --nk 7168:16384 --variants mxfp4-group128 >$R.log 2>&1
  echo "-- ncu perm=$perm decode launch rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
  grep -E "Duration|SM Frequency|DRAM Throughput|Registers Per|Achieved Occupancy|Block Limit|Warp Cycles Per Issued|Issue Slots|Eligible Warps|Grid Size" $R.txt | head -14
  python3 ../scripts/sass-stalls ${R}_sass.csv --top 25 2>&1 | head -36 >${R}_stalls.txt; head -36 ${R}_stalls.txt
  rm -f $R.ncu-rep ${R}_sass.csv
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
