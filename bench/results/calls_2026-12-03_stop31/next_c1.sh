#!/usr/bin/env bash
# Prepared at stop 31 for the next session's first call (after scripts/pack-prebuilt, copy into .snap; carry [".snap"]):
# the landed kernel (c19fb3a and later: stop 30's GEMM plus the thread-release switch) on the 42 shapes, then the
# thread-release switch against the default on the same data, racecheck on the cluster kernels with it, and where the
# default kernel's warps wait at M = 4096 N = 32768 K = 512 (ncu source counters: the per-tile cost).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== bench/linear 42 shapes (defaults)"
timeout 330 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; tail -46 $W/linear42.log
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d env=%-30s graph=%8.2f us rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_THREAD_RELEASE
for s in 4096:32768:512 4096:4096:7168 4096:7168:16384 512:24576:1536 512:4096:7168 128:32768:512; do
  [ $(( $(date +%s) - s0 )) -lt 470 ] || break
  IFS=: read -r m n k <<<"$s"
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs ";$T=1;;$T=1" >$W/tr_${m}_${n}_${k}.txt 2>&1
  echo "== M=$m N=$n K=$k rc=$? $(el)"; show $W/tr_${m}_${n}_${k}.txt
done
for t in SharedBTilesPastM SharedATilesPastN; do
  [ $(( $(date +%s) - s0 )) -lt 540 ] || break
  FINEGEMM_GEMM_THREAD_RELEASE=1 timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda_linear \
    --gtest_filter="CudaTest.$t" >$W/race_$t.log 2>&1
  echo "racecheck $t thread release rc=$? $(el) $(grep -E 'SUMMARY' $W/race_$t.log | tail -1)"
done
# Where the default kernel's warps wait at short K (per-tile cost, "What is next" item 1): ncu source counters.
for s in 4096:32768:512; do
  [ $(( $(date +%s) - s0 )) -lt 480 ] || break
  IFS=: read -r m n k <<<"$s"
  timeout 90 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f -o $W/short_$n --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --import-source no --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg \
    $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic >$W/short_$n.log 2>&1
  echo "ncu M=$m N=$n K=$k rc=$? $(el)"
  ncu -i $W/short_$n.ncu-rep --page source --print-source sass --csv >$W/short_${n}_sass.csv 2>&1
  python3 scripts/sass-stalls $W/short_${n}_sass.csv --top 40 >$W/short_${n}_stalls.txt 2>&1; head -45 $W/short_${n}_stalls.txt
  ncu -i $W/short_$n.ncu-rep --page details 2>&1 | grep -E "Duration|inst_executed|cycles_elapsed|Warp Cycles Per Issued"
  rm -f $W/short_$n.ncu-rep; gzip $W/short_${n}_sass.csv
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
