#!/usr/bin/env bash
# Stop 31 call 2: one stage release per consumer thread in the GEMM (FINEGEMM_GEMM_THREAD_RELEASE=1): same bits,
# racecheck on the cluster kernels with it (stop 26/27: hazards reported with one lane's arrival after __syncwarp),
# and its speed against the default at M = 4096 / 512 and on the MoE layer.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
timeout 120 $B/tests/test_cuda_linear --gtest_filter='CudaTest.ThreadReleaseSameBits:CudaTest.SharedBTilesPastM:CudaTest.SharedATilesPastN' >$W/t_lin.txt 2>&1
echo "test_cuda_linear rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[ +(OK|FAILED) ' $W/t_lin.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -A6 Failure $W/t_lin.txt | head -30
for t in SharedBTilesPastM SharedATilesPastN; do
  FINEGEMM_GEMM_THREAD_RELEASE=1 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda_linear \
    --gtest_filter="CudaTest.$t" >$W/race_$t.log 2>&1
  echo "racecheck $t thread release rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E 'SUMMARY' $W/race_$t.log | tail -1)"
done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d env=%-34s graph=%8.2f us %7.1f TFLOP/s rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_",""), r["us_graph"], 2e-6*r["m"]*r["n"]*r["k"]/r["us_graph"], r["rel_err"]))
' $1; }
E=FINEGEMM_GEMM_THREAD_RELEASE
for s in 4096:4096:7168 4096:7168:16384 4096:24576:1536 512:4096:7168 512:7168:16384; do
  IFS=: read -r m n k <<<"$s"
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$E=1;;$E=1" >$W/tr_${m}_${n}_${k}.txt 2>$W/tr_${m}_${n}_${k}.err
  echo "== M=$m N=$n K=$k rc=$? ($(( $(date +%s) - s0 )) s)"; show $W/tr_${m}_${n}_${k}.txt
done
for o in 0 1 0 1; do
  FINEGEMM_GEMM_THREAD_RELEASE=$o timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_t$o.jsonl 2>$W/moe_t$o.err
  echo "moe thread_release=$o rc=$? ($(( $(date +%s) - s0 )) s)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_t$o.jsonl
done
# Where a short-K prefill GEMM's warps wait (epilogue share): M = 512 N = 24576 K = 1536, default config.
timeout 120 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f -o $W/short --section SpeedOfLight \
  --section WarpStateStats --section SourceCounters --import-source no --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__cycles_elapsed.avg \
  $B/bench/bench_cuda_linear --m-major-scales --m 512 --nk 24576:1536 --variants block-fp32-dynamic >$W/short.log 2>&1
echo "ncu short rc=$? ($(( $(date +%s) - s0 )) s)"
ncu -i $W/short.ncu-rep --page source --print-source sass --csv >$W/short_sass.csv 2>&1
python3 scripts/sass-stalls $W/short_sass.csv --top 40 >$W/short_stalls.txt 2>&1; head -45 $W/short_stalls.txt
ncu -i $W/short.ncu-rep --page details 2>&1 | grep -E "Duration|gmma|inst_executed|cycles_elapsed|Warp Cycles Per Issued|Registers"
rm -f $W/short.ncu-rep; gzip $W/short_sass.csv
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
