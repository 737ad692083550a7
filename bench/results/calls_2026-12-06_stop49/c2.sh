#!/usr/bin/env bash
# Stop 49 call 3 (carry [".snap/prebuilt.txz", ".snap/c2.sh"]; <= ~220 s): the stream-K tail with its partial published
# by the producer warpgroup's second warp (the consumers no longer fence their stores): LeanStreamKTail, then the dense
# FP8 shapes with M-major scales (the lean kernel's input) at M = 4096 / 2048 / 512 with and without
# FINEGEMM_GEMM_LEAN_STREAMK=1, then ncu of one lean launch each way at two shapes (time, DRAM bytes, L2 hit rate).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-30s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
timeout 100 $B/tests/test_cuda_linear --gtest_filter='*LeanStreamKTail*' >$W/sk_tests.log 2>&1
echo "stream-K test rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|^\[ +OK" $W/sk_tests.log | head -4; grep -hA4 "Failure" $W/sk_tests.log | head -20
NK=4096:7168,7168:16384,2112:7168,24576:1536,7168:2048,576:7168,32768:512
for m in 4096 2048 512 4096; do
  if left 150; then
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $NK --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_STREAMK=1" >>$W/mm_$m.jsonl 2>>$W/mm_$m.err
    echo "-- M = $m $(el)"; tail -n 14 $W/mm_$m.jsonl >$W/last.jsonl; show $W/last.jsonl
  fi
done
for shape in 2048:2112:7168 4096:4096:7168; do
  IFS=: read m n k <<<"$shape"
  for sk in 0 1; do
    if left 200; then
      FINEGEMM_GEMM_LEAN_STREAMK=$sk timeout 40 ncu --clock-control none -k regex:gemm_lean --launch-skip 2 --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct --csv \
        $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic >$W/ncu_${m}_${n}_$sk.csv 2>&1
      echo "-- ncu M=$m N=$n K=$k STREAMK=$sk $(el)"; grep -E '"(gpu__time|dram__|lts__)' $W/ncu_${m}_${n}_$sk.csv | awk -F'","' '{print "  " $(NF-2) " " $(NF-1) " " $NF}'
    fi
  done
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
