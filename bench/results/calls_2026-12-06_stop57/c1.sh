#!/usr/bin/env bash
# The next session's first call, as planned at the end of stop 56 (never run; carry [".snap/prebuilt.txz",
# ".snap/next.sh"] after scripts/pack-prebuilt; <= ~560 s). In order:
# (1) on an H200: the DeepSeek-V3 FP8 and FP4 layers at T = 4096, two rounds (issue 4 and issue 5's MoE prefill),
#     dense prefill FP4 against FP8 twice (issue 3's M = 4096 bars, issue 5's dense prefill);
# (2) the FP4 ring trace with stop 56's two stamps inside issue_packed (where its ~640 cycles go);
# (3) test_cuda_moe's lean tests right after those benchmarks (stop 56 call 1's one failing process came there),
#     then GroupedLeanSameBits under racecheck and synccheck, cut at the time left;
# (4) on an H200: ncu of the FP8 expert GEMMs at T = 4096 with the warp stalls and the SM clock.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
lin() { cat "$@" | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%-5d N=%-6d K=%-6d %-18s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'; }
summ() { echo "   $(grep -h 'test data seed' $1 | head -1 | cut -c1-40) failures $(grep -c Failure $1); $(grep -h 'FINEGEMM_GROUPED_LEAN=' $1 | sed 's/.* y=/y=/' | sort | uniq -c | tr '\n' ';' | cut -c1-300)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
H200=0; grep -q H200 $W/gpu.txt && H200=1
for round in 1 2; do
  timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- DeepSeek-V3 T=4096 round $round rc=$? $(el)"; show $W/moe_$round.jsonl
done
for rep in 1 2; do
  timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
done
echo "-- dense prefill $(el)"; lin $W/dense_*.jsonl
FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring.txt timeout 30 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring.jsonl 2>$W/ring.err
echo "-- FP4 ring trace rc=$? $(el)"; python3 $ROOT/scripts/fp4-lean-ring $W/ring.txt --mhz 1980 2>&1 | head -14
timeout 90 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1
echo "-- test_cuda_moe lean/fp4 after the benchmarks rc=$? $(el)"; summ $W/test_moe.txt
if [ $H200 = 1 ] && left 330; then
  R=$W/ncu_fp8
  timeout 110 ncu --clock-control none -k "regex:gemm" --launch-count 2 -f -o $R --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$R.log 2>&1
  echo "-- ncu FP8 T=4096 rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit Rate|dram__bytes|gmma|SM Frequency|per_second|Warp Cycles Per" $R.txt | cut -c1-150 | head -40
  ncu -i $R.ncu-rep --page raw 2>/dev/null | grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio" >$R.stall.txt; sort -k3 -g -r $R.stall.txt | head -14
  rm -f $R.ncu-rep
fi
for tool in racecheck synccheck; do
  if left 470; then
    timeout $(( 540 - ($(date +%s) - s0) )) compute-sanitizer --tool $tool --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/$tool.txt 2>&1
    echo "-- $tool rc=$? $(el)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Barrier|Race|hazard" $W/$tool.txt | head -8; summ $W/$tool.txt
  fi
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
