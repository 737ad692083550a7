#!/usr/bin/env bash
# Stop 39, call 5 (carry [".snap"] after scripts/pack-prebuilt): the split-finish test with its loop fixed, the FP4 MoE
# crafted-spread test at the seed that failed in call 4 and at fresh seeds, the new 192-row default at M = 4096, then
# Nsight Compute on the FP4 lean kernel (2.4x the FP8 lean kernel's time per stage in call 4): where its producers wait.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 200 $B/tests/test_cuda_linear --gtest_filter='CudaTest.DecodeSplitFinishSameBits:GemmConfig.*' >$W/finish_linear.log 2>&1
echo "DecodeSplitFinishSameBits rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|did not finish|exception" $W/finish_linear.log | head -12
FINEGEMM_TEST_SEED=17575496020904828288 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/moe_seed.log 2>&1
echo "Fp4Moe crafted, call 4's seed rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|actual|test.cpp:1[01][0-9][0-9]: (expanded|FINEGEMM)" $W/moe_seed.log | head -12
timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' --gtest_repeat=6 >$W/moe_fresh.log 2>&1
echo "Fp4Moe crafted, 6 fresh rc=$? $(el)"; grep -E "seed|actual" $W/moe_fresh.log | head -20
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-16s M=%-5d N=%-6d K=%-6d %-22s ev=%8.2f graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us"], r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
for s in 2112:7168 576:7168 32768:512; do
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk $s --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN=0;FINEGEMM_GEMM_LEAN=192" >$W/def_${s/:/_}.jsonl 2>/dev/null
  echo "-- $s $(el)"; show $W/def_${s/:/_}.jsonl
done
R=$W/ncu_fp4lean
FINEGEMM_FP4_LEAN=1 timeout 240 ncu --clock-control none -k "regex:sm90_fp4_gemm_lean" --launch-skip 3 --launch-count 1 -f -o $R \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis --import-source no \
  --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,smsp__issue_active.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
  $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 >$R.log 2>&1
echo "ncu rc=$? $(el)"
ncu -i $R.ncu-rep --page details >$R.txt 2>&1
ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
grep -E "^  [a-z_0-9]+.*\(|Duration|Issue Slot|Warp Cycles Per Issued|bank_conflicts|issue_stalled_(barrier|long|short|wait|mio|lg|math|no_inst|sleeping|membar|branch|dispatch|drain|imc|misc|not_sel|selected|tex)" $R.txt | head -60
python3 scripts/sass-stalls ${R}_sass.csv --top 40 2>&1 | head -70
FINEGEMM_FP4_LEAN=1 timeout 60 ncu --clock-control none -k "regex:fp4_fold_scan" --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 2>&1 | grep -E "fp4_fold|Duration" | head -4
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
