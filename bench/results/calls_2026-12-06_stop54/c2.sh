#!/usr/bin/env bash
# Stop 54, call 2 (carry [".snap/prebuilt.txz", ".snap/c2.sh"]; <= ~400 s). (1) tests after the shared-memory
# attribute fix (test_cuda_fp4's scans, test_cuda_moe's lean / FP4 tests with GroupedLeanByDefault's new T = 128 case);
# (2) DeepSeek-V3 FP8 and FP4 layers at T = 4096, two rounds (the FP4 layer crashed on 8475d6d); (3) the FP8 layer
# across 32..112 rows per expert, the new default (128-row lean tiles from 48 to 95 rows) against FINEGEMM_GROUPED_LEAN=0
# and =192, DeepSeek-V3 and Qwen3-30B-A3B; (4) ncu of the FP4 layer's expert GEMMs at T = 4096 (DRAM bytes and rate).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W; ROOT=$(cd .. && pwd)
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { grep -h '^{' "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); print("  %-14s T=%-6d %-22s layer %9.1f us  gemm %6.1f TF/s  %s rel %.2e" % (r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 $B/tests/test_cuda_fp4 --gtest_filter='Fp4Scan*:*Scan*' >$W/test_fp4.txt 2>&1; echo "-- test_cuda_fp4 scans rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure|exception" $W/test_fp4.txt | head -12
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*Fp4*:*Expand*' >$W/test_moe.txt 2>&1; echo "-- test_cuda_moe lean/fp4 rc=$? $(el)"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|Failure" $W/test_moe.txt | head -12
for round in 1 2; do
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 1 >$W/moe4096_$round.jsonl 2>$W/moe4096_$round.err
  echo "-- T=4096 FP8/FP4 round $round rc=$? $(el)"; show $W/moe4096_$round.jsonl; tail -2 $W/moe4096_$round.err
done
for round in 1 2; do
  for gl in default 0 192; do
    if [ $gl = default ]; then unset FINEGEMM_GROUPED_LEAN; else export FINEGEMM_GROUPED_LEAN=$gl; fi
    timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1024,1536,2048,2560,3072,3584 --recipes dynamic --check-tokens 1 >$W/ds_${gl}_$round.jsonl 2>$W/ds_${gl}_$round.err
    timeout 60 $B/bench/bench_cuda_moe --layers qwen3-30b-a3b --tokens 512,1024,1536 --recipes dynamic --check-tokens 1 >$W/qw_${gl}_$round.jsonl 2>$W/qw_${gl}_$round.err
    echo "-- FP8 GROUPED_LEAN=$gl round $round $(el)"; show $W/ds_${gl}_$round.jsonl $W/qw_${gl}_$round.jsonl
  done
done
unset FINEGEMM_GROUPED_LEAN
R=$W/ncu_fp4
timeout 150 ncu --clock-control none -k "regex:gemm" --launch-count 2 -f -o $R \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__inst_executed_pipe_tensor_op_gmma.sum \
  $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$R.log 2>&1
echo "-- ncu fp4 rc=$? $(el)"
ncu -i $R.ncu-rep --page details >$R.txt 2>&1
grep -E "^  [a-z_0-9]+.*gemm|Duration|DRAM Throughput|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|dram__bytes|lts__t_sector_hit|gmma.sum|Grid Size|Registers Per|Dynamic Shared|Achieved Occupancy" $R.txt | cut -c1-150 | head -40
rm -f $R.ncu-rep
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
