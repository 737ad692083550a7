#!/usr/bin/env bash
# Stop 54, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"]; <= ~450 s), binaries of 8475d6d (HEAD 7bac2b5, docs).
# (1) tests: test_cuda_fp4's scan tests (the scans' shared helpers, not yet run on a device), test_cuda_moe's lean and
# FP4 tests; (2) ncu SpeedOfLight + MemoryWorkloadAnalysis of the DeepSeek-V3 FP8 layer's two expert GEMMs at T = 4096
# (where does issue 4's T = 4096 time go: DRAM bytes and rate, L2 hit rate, tensor pipe); the same for the FP4 layer;
# (3) FP8 layer at T = 2048 / 4096, default against FINEGEMM_GROUPED_LEAN=128 / 192, two rounds, event-timed, checked.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 $B/tests/test_cuda_fp4 --gtest_filter='Fp4Scan*:*Scan*' >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 scans rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $W/test_moe.txt | head -12
for rec in dynamic fp4; do
  R=$W/ncu_$rec
  timeout 150 ncu --clock-control none -k "regex:gemm" --launch-count 2 -f -o $R \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__inst_executed_pipe_tensor_op_gmma.sum \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes $rec --check-tokens 1 >$R.log 2>&1
  echo "-- ncu $rec rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  grep -E "^  [a-z_0-9]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|dram__bytes|lts__t_sector_hit|gmma.sum|Grid Size|Registers Per|Dynamic Shared|Achieved Occupancy" $R.txt | cut -c1-150 | head -60
  rm -f $R.ncu-rep
done
for round in 1 2; do
  for gl in default 128 192; do
    if [ $gl = default ]; then unset FINEGEMM_GROUPED_LEAN; else export FINEGEMM_GROUPED_LEAN=$gl; fi
    timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes dynamic --check-tokens 1 >$W/moe_${gl}_$round.jsonl 2>$W/moe_${gl}_$round.err
    echo "-- moe GROUPED_LEAN=$gl round $round rc=$? $(el)"
    grep -h '^{' $W/moe_${gl}_$round.jsonl | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  done
done
unset FINEGEMM_GROUPED_LEAN
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
