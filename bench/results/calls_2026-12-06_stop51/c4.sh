#!/usr/bin/env bash
# Stop 51, call 4 (carry [".snap/prebuilt.txz", ".snap/c4.sh"]; <= ~230 s): the fused scan+expansion as the dense
# default: test_cuda_fp4 whole (three shards side by side), then three rounds of the dense FP4 prefill, the default
# against FINEGEMM_FP4_EXPAND_WIDE=0 (the two kernels), FP8 beside.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 0 1 2; do GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 170 $B/tests/test_cuda_fp4 >$W/fp4_$i.log 2>&1 & done
wait
echo "-- test_cuda_fp4 $(el): $(for i in 0 1 2; do grep -hE '^\[  (PASSED|FAILED)  \]' $W/fp4_$i.log | tr '\n' ' '; done)"
grep -hE "^\[  FAILED  \]|Failure" $W/fp4_*.log | head -6
for rep in 1 2 3; do
  if left 210; then
    timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=0" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  fi
done
echo "-- dense rounds $(el)"
cat $W/dense_*.jsonl | grep -h '^{' | python3 -c '
import sys, json, collections, statistics as st
g = collections.defaultdict(list); e = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l); k = (r["n"], r["k"], r["variant"], r["env"] or "default"); g[k].append(r["us_graph"]); e[k].append(r["us"])
for k in sorted(g):
    f8 = st.median(g[(k[0], k[1], "block-fp32-dynamic", "default")])
    print("  N=%d K=%d %-18s %-28s graph %s median %.2f (%.1f%% of FP8 default)  event median %.2f" % (k[0], k[1], k[2], k[3], " ".join("%.1f" % v for v in g[k]), st.median(g[k]), 100 * f8 / st.median(g[k]), st.median(e[k])))'
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
