#!/usr/bin/env bash
# Stop 58, call 3 (H200 warm): the MoE prefill's tile switches on the H200, interleaved, two rounds, with the SM clock
# and instant power sampled while each process runs; then ncu of the FP4 layer's lean GEMMs at T = 4096.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {  # name T recipe env...
  local name=$1 T=$2 r=$3; shift 3
  nvidia-smi --query-gpu=power.draw.instant,clocks.sm,clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 10 >$W/smi_$name.csv 2>&1 &
  local sp=$!
  env "$@" timeout 80 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens $T --recipes $r --check-tokens 1 >$W/moe_$name.jsonl 2>$W/moe_$name.err
  kill $sp; wait $sp 2>/dev/null
  printf "  %-22s T=%-5s %s | %s\n" "$name" $T "$(grep -h '^{' $W/moe_$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("layer %8.1f us gemm %6.1f TF/s %s" % (r["layer_us"], r["gemm_tflops"], r["check"]))')" "$(python3 -c '
import sys
rows=[l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",")==2]
b=[(float(r[0]),int(r[1]),r[2]) for r in rows if r[0].replace(".","").isdigit() and float(r[0])>300]
if b:
  p=sorted(x[0] for x in b); c=sorted(x[1] for x in b); cap=sum(1 for x in b if int(x[2],16)&4)
  print("busy %d: %.0f W med, %.0f max; SM %d MHz med, %d min; power-capped %d%%" % (len(b),p[len(p)//2],p[-1],c[len(c)//2],c[0],100*cap//len(b)))
else: print("no sample over 300 W of %d" % len(rows))' $W/smi_$name.csv)"
}
for round in 1 2; do
  echo "-- round $round $(el)"
  one fp8_def_$round 4096 dynamic X=1
  one fp8_bm128_$round 4096 dynamic FINEGEMM_GROUPED_BLOCK_M=128
  one fp8_lean192_$round 4096 dynamic FINEGEMM_GROUPED_LEAN=192
  one fp8_lean128_$round 4096 dynamic FINEGEMM_GROUPED_LEAN=128
  one fp4_def_$round 4096 fp4 X=1
  one fp4_lean128_$round 4096 fp4 FINEGEMM_FP4_LEAN=128
  one fp4_lean0_$round 4096 fp4 FINEGEMM_FP4_LEAN=0
done
echo "-- T=16384 $(el)"
one fp8_16k_def 16384 dynamic X=1
one fp8_16k_lean0 16384 dynamic FINEGEMM_GROUPED_LEAN=0
if left 330; then
  R=$W/ncu_fp4
  timeout 200 ncu --clock-control none -k "regex:lean" --launch-count 2 -f -o $R --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$R.log 2>&1
  echo "-- ncu FP4 lean T=4096 rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*lean|Duration|DRAM Throughput|Compute \(SM\) Throughput|dram__bytes|SM Frequency|L2 Hit|Warp Cycles Per Issued|Registers|Shared Memory Config" $R.txt | cut -c1-140 | head -40
  ncu -i $R.ncu-rep --page raw 2>/dev/null | grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio" >$R.stall.txt; sort -k3 -g -r $R.stall.txt | head -12
  rm -f $R.ncu-rep
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
