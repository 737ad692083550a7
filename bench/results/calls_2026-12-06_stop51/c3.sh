#!/usr/bin/env bash
# Stop 51, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~200 s): the fused scan+expansion rewritten for
# 8-byte halves per lane (each warp store 512 contiguous bytes): its tests first (bit for bit the default kernels'
# output), ncu of its launch beside the default scan and expansion, then five rounds of the dense FP4 prefill
# (M = 4096 N = 4096 K = 7168 and N = 7168 K = 16384) default against FINEGEMM_FP4_EXPAND_WIDE=3, FP8 beside.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='*/Fp4Linear.ExactWideExpansion/*:*/Fp4Linear.ExactGatesChained/*:*/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/*' >$W/tests.log 2>&1
echo "-- tests rc=$? $(el): $(grep -hE '^\[  (PASSED|FAILED)  \]' $W/tests.log | tr '\n' ' ')"
grep -hE "^\[  FAILED  \]|Failure" $W/tests.log | head -6
for mode in default 3; do
  envset=FINEGEMM_NOTHING=1; [ $mode = 3 ] && envset=FINEGEMM_FP4_EXPAND_WIDE=3
  env $envset timeout 60 ncu --clock-control none --cache-control all -k "regex:fp4_" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_write.sum,lts__t_requests_op_write.sum --launch-count 4 \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 >$W/ncu_$mode.txt 2>&1
  echo "-- ncu ($mode) $(el)"
  grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes|lts__t" $W/ncu_$mode.txt | sed 's/  */ /g' | cut -c1-110 | head -24
done
for rep in 1 2 3 4 5; do
  if left 170; then
    timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=3" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
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
