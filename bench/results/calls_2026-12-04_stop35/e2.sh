#!/usr/bin/env bash
# Stop 35 call 3 (carry [".snap"]): the decode loader's batched weight requests (FINEGEMM_DECODE_LOAD_BATCH=2/3)
# against one stage at a time: tests (same bits, FP4 decode, MoE decode path), then dense FP8/FP4 decode and the
# DeepSeek-V3 MoE layer at T = 1 / 16, same process and data where the bench allows, and ncu of the MoE GEMMs.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 100 $B/tests/test_cuda_linear --gtest_filter='CudaTest.DecodeLoadBatchSameBits:CudaTest.Fp8WeightsInTheDecodeKernel' >$W/t_linear.log 2>&1
echo "test_cuda_linear batch rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure" $W/t_linear.log | head -6
timeout 150 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.DecodePath*' >$W/t_moe.log 2>&1
echo "test_cuda_moe decode rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure" $W/t_moe.log | head -6
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d %-10s %-28s ev=%7.2f graph=%7.2f us %.2f TB/s rel=%.1e" % (r["m"], r["n"], r["k"], r["variant"][:10], (r["env"] or "default").replace("FINEGEMM_",""), r["us"], r["us_graph"] or 0, r["weight_tbps"], r["rel_err"]))
' $1; }
E=";FINEGEMM_DECODE_LOAD_BATCH=2;FINEGEMM_DECODE_LOAD_BATCH=3;"
for v in block-fp32-dynamic mxfp4-group128; do
  for m in 1 16 64; do
    [ $(( $(date +%s) - s0 )) -lt 330 ] || break
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk 7168:16384,4096:7168,24576:1536,2112:7168 --variants $v --envs "$E" >$W/dec_${v}_$m.jsonl 2>/dev/null
    echo "-- $v M=$m $(el)"; show $W/dec_${v}_$m.jsonl
  done
done
moe() { python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %s T=%-3d %-22s graph=%7.1f us layer=%7.1f tbps=%.3f" % (sys.argv[1], r["T"], r["variant"], r["layer_us_graph"], r["layer_us"], r["weight_tbps"]))
' "$1"; }
for rep in 1 2; do
  for b in '' 2 3; do
    [ $(( $(date +%s) - s0 )) -lt 470 ] || break
    FINEGEMM_DECODE_LOAD_BATCH=$b timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 2>&1 | tee $W/moe_b${b}_$rep.log | moe "batch='$b'"
  done
done
echo "$(el)"
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for b in '' 2; do
  [ $(( $(date +%s) - s0 )) -lt 540 ] || break
  FINEGEMM_DECODE_LOAD_BATCH=$b timeout 40 ncu --clock-control none -k regex:sm90_fp4_decode --launch-skip 20 --launch-count 4 --metrics $M --csv \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1 --recipes dynamic --check-tokens 1 --iter-scale 0.05 >$W/ncu_moe_b$b.csv 2>/dev/null
  echo "ncu moe batch='$b' rc=$? $(el)"
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
