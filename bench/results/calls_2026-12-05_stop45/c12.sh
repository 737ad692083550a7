#!/usr/bin/env bash
# Stop 45, call 12 (H200 wanted; carry [".snap/prebuilt.txz", ".snap/c12.sh"]; <= ~330 s, sections guarded by the
# elapsed time; run from the repository root's .snap as bash .snap/c12.sh). Diagnostics for the next session:
# (1) the scale warp at long K on the H200 (H100: 1-2% slower at K = 7168), M = 4096 N = 4096 K = 7168 and
#     N = 7168 K = 16384, default against FINEGEMM_GEMM_LEAN_SFB_WARP=1, twice;
# (2) the dense FP4 prefill's kernels one by one (M = 4096 N = 4096 K = 7168, mxfp4-group128): ncu's duration of
#     each launch of two calls (the activation quantization, the fold scan, the expansion, the gated GEMMs), to see
#     which part moves between runs (FP4 193.7-207.1 µs against FP8's 172.7-173.7 in calls 9 and 11);
# (3) ncu of the lean kernel at M = 4096 N = 4096 K = 7168 (issue 3's 1400 TFLOP/s bar, 1380-1392 now): tensor-pipe
#     activity, shared-memory throughput and the consumers' stalls.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-32s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
for rep in 1 2; do
  if left 120; then
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_SFB_WARP=1" >$W/sfb_$rep.jsonl 2>$W/sfb_$rep.err
    echo "-- scale warp at long K, run $rep $(el)"; show $W/sfb_$rep.jsonl
  fi
done
if left 200; then
  timeout 90 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --launch-count 16 \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 >$W/ncu_fp4_prefill.txt 2>&1
  echo "-- ncu, the dense FP4 prefill's launches $(el)"
  grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes" $W/ncu_fp4_prefill.txt | sed 's/  */ /g' | cut -c1-160 | head -60
fi
if left 260; then
  timeout 70 ncu --clock-control none -k "regex:sm90_fp8_gemm_lean" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic >$W/ncu_lean.txt 2>&1
  echo "-- ncu, the lean kernel at M = 4096 N = 4096 K = 7168 $(el)"
  grep -E "Duration|Throughput|gmma|Shared|Warp Cycles|Issue|stalled_(barrier|long|wait|math|gmma|mio|lg|short|no_inst|not_sel|dispatch|membar|sleep|tex|branch|drain|imc|misc|selected)" $W/ncu_lean.txt | sed 's/  */ /g' | cut -c1-150 | head -50
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
