#!/usr/bin/env bash
# Stop 56, call 1 (order: probe, A/B, tests, the MoE rows, ncu (H200), dense, decode, traces; stop 55's planned call c2.sh, plus WarpStateStats in the ncu step, the packed pairs in the A/B, no T = 16384; carry [".snap/prebuilt.txz", ".snap/c1.sh"]; <= ~570 s;
# binaries of HEAD with FINEGEMM_FP4_LEAN_PACKED_ISSUER=32 (warp 1's first producer thread issues
# the grouped 192-row FP4 lean kernel's packed tiles; thread 0 keeps A's).
# In this order: (1) the TMA issue probe (bench/micro/tma_issue.cu, first run); (4) the A/B; (3) the rows; (5); (2) tests: the crafted-spread MoE test (with the new
# switch's same-bits check) under stop 54 call 6's filter and seed, the switch's parsing; (3) DeepSeek-V3 FP8 and FP4
# at T = 1, 16, 4096 (the bars' rows); (4) FP4 T = 4096 A/B, default against =32, fp4-only processes, two rounds;
# (5) dense prefill M = 4096 FP4 against FP8 twice, decode M = 1 / 16 / 64 over issue 3's three shapes; (6) on an
# H200 only: ncu of the FP8 expert GEMMs at T = 4096 and the layers at T = 16384; (7) the two diagnostic traces
# (the diagnostic_trace_buffer refactor's users); (8) test_cuda_moe's lean and FP4 tests.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us graph %8s gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph"), r["gemm_tflops"], r["check"], r["rel_err"]))'; }
lin() { cat "$@" | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%-5d N=%-6d K=%-6d %-18s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
H200=0; grep -q H200 $W/gpu.txt && H200=1
timeout 60 $B/bench/micro_tma_issue >$W/tma_issue.txt 2>&1; echo "-- tma_issue rc=$? $(el)"; tail -12 $W/tma_issue.txt
for round in 1 2; do
  for v in 0 32 pairs; do
    pi=$v; pp=0; [ $v = pairs ] && pi=0 && pp=1
    FINEGEMM_FP4_LEAN_PACKED_ISSUER=$pi FINEGEMM_FP4_LEAN_PACKED_PAIRS=$pp timeout 45 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ab_${v}_$round.jsonl 2>$W/ab_${v}_$round.err
    echo "-- FP4 T=4096 PACKED_ISSUER=$pi PACKED_PAIRS=$pp round $round rc=$? $(el)"; show $W/ab_${v}_$round.jsonl
  done
done
if left 300; then
  FINEGEMM_TEST_SEED=18343406184352838198 timeout 90 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*:*CraftedSpread*' >$W/test_fp4_seed.txt 2>&1
  echo "-- test_cuda_fp4 lean/scan/grouped/crafted (stop 54 call 6's seed) rc=$? $(el)"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure|actual|Which is|PACKED" $W/test_fp4_seed.txt | head -12
  timeout 30 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/test_switch.txt 2>&1; echo "-- switch test rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED) " $W/test_switch.txt
fi
timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe.jsonl 2>$W/moe.err
echo "-- DeepSeek-V3 T=1,16,4096 rc=$? $(el)"; show $W/moe.jsonl
if [ $H200 = 1 ] && left 330; then
  R=$W/ncu_fp8
  timeout 100 ncu --clock-control none -k "regex:gemm" --launch-count 2 -f -o $R --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$R.log 2>&1
  echo "-- ncu FP8 T=4096 rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|dram__bytes|gmma|SM Frequency|per_second" $R.txt | cut -c1-150 | head -30
  ncu -i $R.ncu-rep --page raw 2>/dev/null | grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio|Warp Cycles Per|^  [a-z_0-9]+.*gemm" >$R.stall.txt; grep -E "gemm" $R.stall.txt | cut -c1-120; grep stalled $R.stall.txt | sort -k3 -g -r | head -14
  rm -f $R.ncu-rep
fi
for rep in 1 2; do
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
done
echo "-- dense prefill $(el)"; lin $W/dense_*.jsonl
timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 1,16,64 --nk 4096:7168,24576:1536,7168:16384 --variants block-fp32-dynamic,mxfp4-group128 >$W/decode.jsonl 2>$W/decode.err
echo "-- decode rc=$? $(el)"; lin $W/decode.jsonl
if left 480; then
  FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring.txt timeout 30 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring.jsonl 2>$W/ring.err
  echo "-- FP4 ring trace rc=$? $(el) $(wc -l <$W/ring.txt 2>/dev/null) lines"
  python3 $ROOT/scripts/fp4-lean-ring $W/ring.txt --mhz 1980 2>&1 | head -24
  FINEGEMM_GEMM_LEAN_STREAMK=1 FINEGEMM_GEMM_LEAN_TRACE_FILE=$W/lean.txt timeout 30 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic >$W/lean.jsonl 2>$W/lean.err
  echo "-- stream-K trace rc=$? $(el) $(wc -l <$W/lean.txt 2>/dev/null) lines"; lin $W/lean.jsonl; tail -n 2 $W/lean.err
fi
if left 520; then
  timeout 60 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" $W/test_moe.txt | head -6
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
