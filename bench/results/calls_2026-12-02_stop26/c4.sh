#!/usr/bin/env bash
# Stop 26 call 4: the SASS and per-instruction stalls of cuBLASLt's block-scaled kernel (nvjet 128x128x128, 6 stages,
# 2x1 cluster, cooperative) next to finegemm's same-shaped config (128x128:1c2) at M = 4096 N = 7168 K = 16384; the
# MoE tests after the BF16-scratch removal; the sanitizers.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
S='--section SpeedOfLight --section LaunchStats --section WarpStateStats --section SourceCounters --import-source no'
M='--metrics smsp__inst_executed.sum,smsp__issue_active.sum,sm__cycles_elapsed.avg,sm__inst_executed_pipe_tensor_op_gmma.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed'
prof() {  # name kernel-regex skip cmd...
  local name=$1 k=$2 skip=$3; shift 3
  timeout 100 ncu --clock-control none -k "regex:$k" --launch-skip $skip --launch-count 1 -f -o $W/$name $S $M "$@" >$W/$name.log 2>&1
  echo "ncu $name rc=$? ($(( $(date +%s) - s0 )) s)"
  ncu -i $W/$name.ncu-rep --page details >$W/$name.txt 2>&1
  ncu -i $W/$name.ncu-rep --page source --print-source sass --csv >$W/${name}_sass.csv 2>&1
  python3 scripts/sass-stalls $W/${name}_sass.csv --top 40 >$W/${name}_stalls.txt 2>&1; head -45 $W/${name}_stalls.txt
  grep -E "Duration|gmma|pipe_shared|inst_executed|issue_active|cycles_elapsed|Registers Per|Warp Cycles Per Issued" $W/$name.txt | head -12
  rm -f $W/$name.ncu-rep
}
prof cublas_4096 '^(?!.*(fill|elementwise|vectorized|copy|pad|Memset)).*' 1 python3 bench/cublas_probe.py --shapes 4096:7168:16384 --iters 2 --no-profile
FINEGEMM_GEMM_CONFIG=128x128:1c2 prof ours128c2_4096 sm90_fp8_gemm 3 $B/bench/bench_cuda_linear --m 4096 --nk 7168:16384
timeout 120 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.EveryRecipe*:CudaMoe.GateUpFused*:CudaMoe.ExpertOutputs*' >$W/test_moe.txt 2>&1
echo "moe tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_moe.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -A3 Failure $W/test_moe.txt | head
left=$(( 250 - $(date +%s) + s0 ))
[ $left -gt 60 ] && OUT=$W/san GPU_CHECK_DEADLINE=$left scripts/gpu-check sanitize 2>&1 | tail -12
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
