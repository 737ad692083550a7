#!/usr/bin/env bash
# Stop 31 call 1 (stop 30 call 6 first) (binaries with the GEMV default, M <= 8 at N <= 768): the FP4 decode tests that now run both decode
# kernels (ExactDecodePathsSmall, ExactGemvPaths), then call 5's tile-config comparison (env switches only).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*ExactDecodePathsSmall*:*ExactGemvPaths*:*ExactFoldSpreads*' >$W/t_fp4.txt 2>&1
echo "test_cuda_fp4 (decode) rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_fp4.txt | tr '\n' ' ')"; grep -A8 Failure $W/t_fp4.txt | head -30
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d env=%-30s graph=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
C=FINEGEMM_GEMM_CONFIG
for s in 64:24576:1536 48:24576:1536 64:32768:512 48:32768:512 64:16384:1536 40:24576:2048; do
  IFS=: read -r m n k <<<"$s"
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$C=64x128:1;;$C=64x128:1" >$W/cfg_${m}_${n}.txt 2>$W/cfg_${m}_${n}.err
  echo "== M=$m N=$n K=$k rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/cfg_${m}_${n}.err | head -1)"; show $W/cfg_${m}_${n}.txt
done
timeout 30 $B/bench/bench_cuda_linear --m 1,8 --nk 576:2048 --variants mxfp4-group128 --envs ';FINEGEMM_FP4_GEMV=0' >$W/gemv_default.txt 2>&1
echo "== gemv default rc=$?"; show $W/gemv_default.txt
# L2 and tensor-pipe load of the prefill GEMM at M = 4096 N = 4096 K = 7168 (default 128x128 one CTA, 128x128 pairs,
# 192x128 pairs) and cuBLASLt's kernel: is the main loop bound by the L2's bandwidth?
M='--metrics sm__cycles_elapsed.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,dram__bytes_read.sum.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum'
prof() {  # name kernel-regex skip cmd...
  local name=$1 k=$2 skip=$3; shift 3
  timeout 100 ncu --clock-control none -k "regex:$k" --launch-skip $skip --launch-count 1 -f -o $W/$name --section SpeedOfLight --section MemoryWorkloadAnalysis $M "$@" >$W/$name.log 2>&1
  echo "ncu $name rc=$? ($(( $(date +%s) - s0 )) s)"
  ncu -i $W/$name.ncu-rep --page details >$W/$name.txt 2>&1
  grep -E "Duration|Throughput|gmma|lts__|dram__|Hit Rate|inst_executed|cycles_elapsed|Busy|Bandwidth" $W/$name.txt | head -30
  rm -f $W/$name.ncu-rep
}
prof cublas '^(?!.*(fill|elementwise|vectorized|copy|pad|Memset|distribution|randn|rand|uniform|normal)).*' 1 python3 bench/cublas_probe.py --shapes 4096:4096:7168 --iters 2 --no-profile
prof ours_default sm90_fp8_gemm 3 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic
FINEGEMM_GEMM_CONFIG=128x128:1c2 prof ours_128c2 sm90_fp8_gemm 3 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic
FINEGEMM_GEMM_CONFIG=192x128:1c2 prof ours_192c2 sm90_fp8_gemm 3 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
