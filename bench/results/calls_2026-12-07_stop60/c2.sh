#!/usr/bin/env bash
# Stop 60, call 2 (on the machine call 1 left warm; LIMIT=<timeout_s>), the binaries of 72996a1: (1) two more rounds of
# issue 5's MoE prefill ratio (DeepSeek-V3 T = 4096: FP8, FP4, FP4 with the kept fold scans) and one at T = 2048;
# (2) MoE decode T = 1 / 16, FP8 against FP4 (graph replay); (3) ncu on the H200: the FP4 lean gate_up kernel at
# T = 4096 with the kept scans, and the FP8 layer's gate_up GEMM (issue 4), warp states and per-SASS stalls each.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; LIMIT=${LIMIT:-450}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 60 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-14s T=%-5d %-20s layer %8.1f us graph %8.1f gemm %6.1f TF/s %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph", 0), r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 4 5; do
  left $(( LIMIT - 300 )) || break
  echo "-- round $round $(el)"
  one fp8_$round deepseek-v3 4096 dynamic X=1
  one fp4_$round deepseek-v3 4096 fp4 X=1
  one fp4_sc1_$round deepseek-v3 4096 fp4 FINEGEMM_FP4_SCAN_CACHE=1
done
if left $(( LIMIT - 250 )); then
  echo "-- T = 2048 $(el)"
  one fp8_2048 deepseek-v3 2048 dynamic X=1
  one fp4_2048 deepseek-v3 2048 fp4 X=1
  one fp4_sc1_2048 deepseek-v3 2048 fp4 FINEGEMM_FP4_SCAN_CACHE=1
fi
if left $(( LIMIT - 200 )); then
  echo "-- MoE decode $(el)"
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_dec.jsonl 2>$W/moe_dec.err
  grep -h '^{' $W/moe_dec.jsonl | head -8 | cut -c1-400
fi
prof() {  # name regex recipe env...
  local name=$1 rx=$2 r=$3; shift 3; local R=$W/ncu_$name
  env "$@" timeout 100 ncu --clock-control none -k "regex:$rx" --launch-skip 0 --launch-count 1 -f -o $R \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters --import-source no \
    --metrics sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes $r --check-tokens 0 >$R.log 2>&1
  echo "-- ncu $name rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Duration|SM Frequency|DRAM Throughput|dram__bytes|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots|Eligible Warps" $R.txt | head -12
  python3 ../scripts/sass-stalls ${R}_sass.csv --top 25 2>&1 | head -36 >${R}_stalls.txt; head -36 ${R}_stalls.txt
  rm -f $R.ncu-rep ${R}_sass.csv
}
left $(( LIMIT - 130 )) && prof fp4_gu "lean" fp4 FINEGEMM_FP4_SCAN_CACHE=1
left $(( LIMIT - 60 )) && prof fp8_gu "lean|grouped" dynamic X=1
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
