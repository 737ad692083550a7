#!/usr/bin/env bash
# Stop 28 call 1: the three-consumer issue ring (FINEGEMM_GEMM_ROTATE_ISSUE=1): its same-bits test, A/B at M = 4096
# and 512 (192x128 forced where the heuristic takes 128x128), the MoE layer with and without it; then the GPU test
# binaries stop 27 cut short (test_cuda_moe, test_cuda_fp4).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-58s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
run() {  # name m n:k envs [extra args]
  FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --m $2 --nk $3 --variants block-fp32-dynamic --envs "$4" $5 >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*' $W/$1.err | sort | uniq | tr '\n' '|')"; show $W/$1.txt
}
before() { [ $(( $(date +%s) - s0 )) -lt $1 ] || { echo "skipped (past $1 s): $*"; return 1; }; }
t() {  # binary timeout [filter]
  timeout $2 $B/tests/$1 ${3:+--gtest_filter=$3} >$W/$1$4.txt 2>&1
  echo "$1 $3 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $W/$1$4.txt | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' $W/$1$4.txt | head; grep -A4 Failure $W/$1$4.txt | head -20
}
t test_cuda_linear 150 'CudaTest.RotatedIssueSameBits' _rot
R='FINEGEMM_GEMM_ROTATE_ISSUE=1'; T='FINEGEMM_GEMM_CONFIG'
run r7168 4096 7168:16384 ";$R;$T=192x128:1;$T=192x128:1,$R"
run r4096 4096 4096:7168 ";$R;$T=192x128:1c2;$T=192x128:1c2,$R"
run r24576 4096 24576:1536 ";$R"
run r2112 4096 2112:7168 ";$R"
run s7168 512 7168:16384 ";$R;$T=192x128:1c2;$T=192x128:1c2,$R"
run s4096 512 4096:7168 ";$T=192x128:1;$T=192x128:1,$R"
before 330 && for r in 0 1; do
  FINEGEMM_GEMM_ROTATE_ISSUE=$r timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_r$r.jsonl 2>$W/moe_r$r.err
  echo "moe rotate=$r rc=$?"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_r$r.jsonl
done
# Where the 192x128 kernel's time goes beyond the tensor pipe: shared-memory and L2 traffic (default, then with the ring).
M='--metrics sm__cycles_elapsed.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active'
for r in 0 1; do
  before 400 || break
  FINEGEMM_GEMM_ROTATE_ISSUE=$r timeout 100 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f -o $W/n_r$r \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats $M \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 7168:16384 --variants block-fp32-dynamic >$W/n_r$r.log 2>&1
  echo "== ncu rotate=$r rc=$? ($(( $(date +%s) - s0 )) s)"
  ncu -i $W/n_r$r.ncu-rep --page details >$W/n_r$r.txt 2>&1; rm -f $W/n_r$r.ncu-rep
  grep -E "Duration|SM Frequency|Memory Throughput|L1/TEX Hit|Shared|gmma|bank|wavefronts|lts__t_bytes|dram__bytes|xbar2l1tex|inst_executed|Warp Cycles Per Issued|Compute \(SM\)|Mem Busy|Max Bandwidth|Mem Pipes" $W/n_r$r.txt | head -40
done
before 430 && t test_cuda_fp4 70
left=$(( 570 - $(date +%s) + s0 )); [ $left -gt 30 ] && t test_cuda_moe $left
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
