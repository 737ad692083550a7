#!/usr/bin/env bash
# Stop 55, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"]; <= ~560 s), binaries of 2e8de9d.
# (1) the TMA issue probe (bench/micro/tma_issue.cu, first run); (2) the diagnostic_trace_buffer refactor's two users:
# the FP4 ring trace and the stream-K trace run and write stamps; (3) the bars' rows on whatever card comes (an H200
# is what they need): DeepSeek-V3 MoE FP8 and FP4 at T = 1, 16, 4096 twice, T = 16384 once; dense prefill M = 4096
# FP4 against FP8 (N = 4096 K = 7168, N = 7168 K = 16384) twice; decode M = 1 / 16 / 64 FP8 and FP4 over issue 3's
# three decode shapes; (4) test_cuda_fp4's crafted spreads with stop 54's seed, test_cuda_moe's lean and FP4 tests.
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
timeout 60 $B/bench/micro_tma_issue >$W/tma_issue.txt 2>&1; echo "-- tma_issue rc=$? $(el)"; cat $W/tma_issue.txt | tail -8
for round in 1 2; do
  timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_$round.jsonl 2>$W/moe_$round.err
  echo "-- DeepSeek-V3 T=1,16,4096 round $round rc=$? $(el)"; show $W/moe_$round.jsonl
done
for rep in 1 2; do
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
done
echo "-- dense prefill $(el)"; lin $W/dense_*.jsonl
timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 1,16,64 --nk 4096:7168,24576:1536,7168:16384 --variants block-fp32-dynamic,mxfp4-group128 >$W/decode.jsonl 2>$W/decode.err
echo "-- decode rc=$? $(el)"; lin $W/decode.jsonl
if left 330; then
  timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_16k.jsonl 2>$W/moe_16k.err
  echo "-- T=16384 rc=$? $(el)"; show $W/moe_16k.jsonl
fi
if left 360; then
  # Issue 4 on this card: the FP8 expert GEMMs at T = 4096 under ncu (DRAM bytes and rate, SM and tensor pipe).
  R=$W/ncu_fp8
  timeout 100 ncu --clock-control none -k "regex:gemm" --launch-count 2 -f -o $R --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >$R.log 2>&1
  echo "-- ncu FP8 T=4096 rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|dram__bytes|gmma|SM Frequency|elapsed.avg.per_second" $R.txt | cut -c1-150 | head -40
  rm -f $R.ncu-rep
fi
if left 430; then
  FINEGEMM_FP4_LEAN_TRACE_FILE=$W/ring.txt timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/ring.jsonl 2>$W/ring.err
  echo "-- FP4 ring trace rc=$? $(el) $(wc -l <$W/ring.txt 2>/dev/null) lines"; show $W/ring.jsonl
  python3 $ROOT/scripts/fp4-lean-ring $W/ring.txt --mhz 1980 2>&1 | head -30
  FINEGEMM_GEMM_LEAN_STREAMK=1 FINEGEMM_GEMM_LEAN_TRACE_FILE=$W/lean.txt timeout 30 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic >$W/lean.jsonl 2>$W/lean.err
  echo "-- stream-K trace rc=$? $(el) $(wc -l <$W/lean.txt 2>/dev/null) lines"; lin $W/lean.jsonl; tail -n 2 $W/lean.err
fi
if left 480; then
  FINEGEMM_TEST_SEED=18343406184352838198 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*:*CraftedSpread*' >$W/test_fp4_seed.txt 2>&1; echo "-- crafted spread (stop 54's seed) rc=$? $(el)"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|actual|rel" $W/test_fp4_seed.txt | head -8
  timeout 60 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]|Failure" $W/test_moe.txt | head -6
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
