#!/usr/bin/env bash
# Stop 58, call 2 (H200 warm after call 1): the power and SM clock while the DeepSeek-V3 MoE layers run (nvidia-smi
# sampled every 20 ms), T = 4096 and 16384, FP8 and FP4; then ncu of the FP4 layer's GEMMs at T = 4096 with the clock.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,power.limit,power.max_limit,clocks.max.sm,clocks.max.mem,temperature.gpu --format=csv | tee $W/gpu.txt
for T in 4096 16384; do for r in dynamic fp4; do
  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks.mem,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 >$W/smi_${T}_$r.csv 2>&1 &
  sp=$!
  timeout 80 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens $T --recipes $r --check-tokens 1 >$W/moe_${T}_$r.jsonl 2>$W/moe_${T}_$r.err
  kill $sp; wait $sp 2>/dev/null
  echo "-- T=$T $r $(el): $(grep -h '^{' $W/moe_${T}_$r.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("layer %.1f us gemm %.1f TF/s %s" % (r["layer_us"], r["gemm_tflops"], r["check"]))')"
  python3 - $W/smi_${T}_$r.csv <<'PY'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
rows = [r for r in rows if r[1].endswith("W")]
p = [float(r[1].split()[0]) for r in rows]; c = [int(r[2].split()[0]) for r in rows]
busy = [(pp, cc, r[5]) for pp, cc, r in zip(p, c, rows) if pp > 250]
if busy:
    bp = sorted(x[0] for x in busy); bc = sorted(x[1] for x in busy)
    from collections import Counter
    print("   samples %d busy %d power median %.0f W max %.0f; SM clock median %d min %d MHz; throttle %s" % (len(rows), len(busy), bp[len(bp)//2], bp[-1], bc[len(bc)//2], bc[0], Counter(x[2] for x in busy).most_common(3)))
else:
    print("   samples %d, none over 250 W; max %.0f W" % (len(rows), max(p) if p else 0))
PY
done; done
if left 300; then
  R=$W/ncu_fp4
  timeout 150 ncu --clock-control none -k "regex:gemm|expand|scan" --launch-count 6 -f -o $R --section SpeedOfLight --section WarpStateStats \
    --metrics dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$R.log 2>&1
  echo "-- ncu FP4 T=4096 rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*(gemm|expand|scan)|Duration|DRAM Throughput|Compute \(SM\) Throughput|dram__bytes|SM Frequency|Warp Cycles Per Issued" $R.txt | cut -c1-120 | head -50
  rm -f $R.ncu-rep
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
