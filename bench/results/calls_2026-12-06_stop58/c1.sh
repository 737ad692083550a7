#!/usr/bin/env bash
# Stop 58, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"] after scripts/pack-prebuilt; <= ~560 s). In order:
# (1) the DeepSeek-V3 FP8 and FP4 layers at T = 4096, two rounds (issue 4, issue 5's MoE prefill) and decode T = 1 / 16;
# (2) dense prefill FP4 against FP8 twice (issue 3's M = 4096 bars, issue 5's dense prefill);
# (3) dense decode FP8 and FP4 at M = 1 / 16 / 64 on the bars' shapes (issue 3's 3.0 TB/s, issue 5's 1.6x);
# (4) on an H200: ncu of the FP8 expert GEMMs at T = 4096 with the warp stalls and the SM clock;
# (5) test_cuda_moe's lean and FP4 tests, then GroupedLeanSameBits under racecheck, cut at the time left.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us graph %s gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph", "-"), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
lin() { cat "$@" | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); wb = r["n"] * r["k"] * (0.5 + 1/32 if "mxfp4" in r["variant"] else 1 + 1/16384) / 1e6
    best = min(x for x in (r["us_graph"] or 1e9, r["us"] or 1e9))
    print("  M=%-5d N=%-6d K=%-6d %-18s graph=%8.2f us event=%8.2f  W %.2f TB/s  rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us_graph"] or 0, r["us"] or 0, wb / best, r["rel_err"] or 0))'; }
summ() { echo "   $(grep -h 'test data seed' $1 | head -1 | cut -c1-40) failures $(grep -c Failure $1); passed $(grep -c '^\[       OK' $1)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
H200=0; grep -q H200 $W/gpu.txt && H200=1
for round in 1 2; do
  timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- DeepSeek-V3 T=4096 round $round rc=$? $(el)"; show $W/moe_$round.jsonl
done
timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_dec.jsonl 2>$W/moe_dec.err
echo "-- DeepSeek-V3 decode rc=$? $(el)"; show $W/moe_dec.jsonl
for rep in 1 2; do
  timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
done
echo "-- dense prefill $(el)"; lin $W/dense_*.jsonl
timeout 90 $B/bench/bench_cuda_linear --m 1,16,64 --nk 7168:16384,4096:7168,24576:1536 --variants block-fp32-dynamic,mxfp4-group128 >$W/decode.jsonl 2>$W/decode.err
echo "-- dense decode rc=$? $(el)"; lin $W/decode.jsonl
if [ $H200 = 1 ] && left 300; then
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
if left 420; then
  timeout 90 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1
  echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"; summ $W/test_moe.txt
fi
if left 470; then
  timeout $(( 540 - ($(date +%s) - s0) )) compute-sanitizer --tool racecheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/racecheck.txt 2>&1
  echo "-- racecheck rc=$? $(el)"; grep -E "RACECHECK SUMMARY|hazard" $W/racecheck.txt | head -4
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
