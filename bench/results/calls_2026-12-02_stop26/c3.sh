#!/usr/bin/env bash
# Stop 26 call 3: what cuBLASLt runs (kernel names, launch shape, tensor-pipe activity under ncu) next to finegemm's
# kernel at M = 4096 N = 7168 K = 16384; the BF16 expert outputs at more token counts; static and UE8M0 variants;
# the sanitizers.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
before() { [ $(( $(date +%s) - s0 )) -lt $1 ] || { echo "skipped (past $1 s): $*"; return 1; }; }
moe() {  # name envs layers tokens [timeout]
  env $2 timeout ${5:-90} $B/bench/bench_cuda_moe --layers $3 --tokens $4 --recipes dynamic --check-tokens 4 >$W/moe_$1.jsonl 2>$W/moe_$1.err
  echo "moe $1 [$2] rc=$? ($(( $(date +%s) - s0 )) s)"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_$1.jsonl
}
timeout 60 python3 bench/cublas_probe.py --shapes 4096:7168:16384,4096:4096:7168,512:7168:16384,512:24576:1536,128:32768:512,4096:32768:512 2>&1 | tee $W/cublas_kernels.txt
M='--metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__issue_active.sum,sm__cycles_elapsed.avg,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,launch__cluster_dim_x,launch__cluster_dim_y,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
S='--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats'
timeout 90 ncu --clock-control none -k 'regex:^(?!.*(fill|elementwise|vectorized|copy|pad)).*' --launch-skip 1 --launch-count 1 $S $M \
  python3 bench/cublas_probe.py --shapes 4096:7168:16384 --iters 2 --no-profile >$W/ncu_cublas_4096_7168_16384.txt 2>&1; echo "ncu cublas rc=$? ($(( $(date +%s) - s0 )) s)"
timeout 90 ncu --clock-control none -k 'regex:sm90_fp8_gemm' --launch-skip 3 --launch-count 1 $S $M \
  $B/bench/bench_cuda_linear --m 4096 --nk 7168:16384 >$W/ncu_ours_4096_7168_16384.txt 2>&1; echo "ncu ours rc=$? ($(( $(date +%s) - s0 )) s)"
for f in $W/ncu_cublas_4096_7168_16384.txt $W/ncu_ours_4096_7168_16384.txt; do echo "== $f"; grep -E '^  [a-zA-Z_].*\(|Duration|Registers Per|Block Size|Grid Size|Cluster Size|Shared Memory Config|Dynamic Shared|Static Shared|Theoretical Occ|Achieved Occ|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|gmma_cycles|inst_executed|issue_active|cycles_elapsed|lts__t_sectors|dram__bytes|cluster_dim|Warp Cycles Per Issued|Threads  ' $f | head -40; grep -E "issue_stalled" $f | awk '$NF+0 > 0.05' | head -20; done
before 330 && moe def '' deepseek-v3,qwen3-30b-a3b 1,16,2048,16384 120
before 330 && moe ybf16 FINEGEMM_MOE_Y=bf16 deepseek-v3,qwen3-30b-a3b 1,16,2048,16384 120
left=$(( 470 - $(date +%s) + s0 ))
[ $left -gt 60 ] && timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,128,4096 \
    --variants block-fp32-dynamic,block-fp32-static,block-ue8m0-dynamic --budget-s $(( left - 10 )) \
    --out "$W/linear_variants_$(date -u +%Y-%m-%d).json" >$W/bench_variants.txt 2>$W/bench_variants.err
echo "variants rc=$? ($(( $(date +%s) - s0 )) s)"; tail -70 $W/bench_variants.txt | cut -c1-120
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
