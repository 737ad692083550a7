#!/usr/bin/env bash
# Stop 51, call 2 (warm follow-up of c1.sh; carry [".snap/prebuilt.txz", ".snap/c2.sh"]): the dense FP4 prefill
# (M = 4096 N = 4096 K = 7168, mxfp4-group128) with the fused scan+expansion and the chained gates, five rounds of
# the four combinations beside FP8; then an nsys timeline of one graph replay per combination (the gaps between the
# launches, which ncu's serialized timing cannot show).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
E=";FINEGEMM_FP4_EXPAND_WIDE=3;FINEGEMM_FP4_GATE_PDL=1;FINEGEMM_FP4_EXPAND_WIDE=3,FINEGEMM_FP4_GATE_PDL=1"
for rep in 1 2 3 4 5; do
  if left 200; then
    timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs "$E" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  fi
done
echo "-- dense rounds $(el)"
cat $W/dense_*.jsonl | grep -h '^{' | python3 -c '
import sys, json, collections, statistics as st
g = collections.defaultdict(list); e = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l); k = (r["variant"], r["env"] or "default"); g[k].append(r["us_graph"]); e[k].append(r["us"])
f8 = st.median(g[("block-fp32-dynamic", "default")])
for k in sorted(g):
    print("  %-18s %-50s graph %s median %.2f (%.1f%% of FP8 default speed)  event median %.2f" % (k[0], k[1], " ".join("%.1f" % v for v in g[k]), st.median(g[k]), 100 * f8 / st.median(g[k]), st.median(e[k])))'
if command -v nsys >/dev/null && left 300; then
  for cfg in default "FINEGEMM_FP4_EXPAND_WIDE=3,FINEGEMM_FP4_GATE_PDL=1"; do
    tag=$( [ $cfg = default ] && echo def || echo both )
    envs=FINEGEMM_NOTHING=1; [ $cfg != default ] && envs="FINEGEMM_FP4_EXPAND_WIDE=3 FINEGEMM_FP4_GATE_PDL=1"
    env $envs timeout 90 nsys profile --cuda-graph-trace=node -t cuda -o $W/nsys_$tag -f true \
      $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 >$W/nsys_$tag.log 2>&1
    timeout 60 nsys stats -r cuda_gpu_trace -f csv -o $W/trace_$tag $W/nsys_$tag.nsys-rep >/dev/null 2>&1
    echo "-- nsys $tag $(el)"
    python3 - $W/trace_${tag}_cuda_gpu_trace.csv <<'PY'
import sys, csv
rows = list(csv.DictReader(open(sys.argv[1])))
if not rows: print("  no rows"); sys.exit()
ks = [k for k in rows[0] if k.startswith("Start")][0]; kd = [k for k in rows[0] if k.startswith("Duration")][0]
# The last 14 launches: one graph replay's kernels and memsets, with the gap before each.
tail = rows[-14:]
prev = None
for r in tail:
    s, d = float(r[ks]), float(r[kd])
    gap = (s - prev) if prev is not None else 0
    print("  start %+9.2f us  dur %8.2f us  gap %7.2f  %s" % ((s - float(tail[0][ks])) / 1e3, d / 1e3, gap / 1e3, r["Name"][:70]))
    prev = s + d
PY
  done
fi
cd $OUT && tar czf all.tgz w --exclude='*.nsys-rep' --exclude='*.sqlite' && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
