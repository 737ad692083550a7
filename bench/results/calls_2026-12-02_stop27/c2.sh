#!/usr/bin/env bash
# Stop 27 call 2: the hoisted split now on by default (and extended to 192-wide tiles): its test, the ring probe with
# per-thread arrivals under racecheck, the tile shapes at M = 512 and 4096 with the hoist (128x192's SMEM traffic per
# FLOP is the lowest of the two-consumer tiles), the A scale bulk copy on top of the hoist, the MoE layer with and
# without the hoist, then the 42-shape table with CUDA-graph replay.
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
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.HoistedSplitSameBits' >$W/test_hoist.txt 2>&1
echo "hoist test rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_hoist.txt | tr '\n' ' ')"; grep -A4 Failure $W/test_hoist.txt | head -20
for probe in OneCta ThreadArrive; do
  timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda_edge --gtest_filter="CudaEdge.ClusterRingProbe$probe" >$W/probe_$probe.log 2>&1
  echo "racecheck probe $probe rc=$? $(grep -E 'SUMMARY|OK|FAILED' $W/probe_$probe.log | tr '\n' ' ')"
done
T='FINEGEMM_GEMM_CONFIG'
E=";FINEGEMM_GEMM_HOIST_SPLIT=0;$T=128x192:1;$T=128x192:1c2;$T=128x128:1c2;$T=192x128:1c2;$T=128x256:1c2"
run t7168 4096 7168:16384 "$E"
run t4096 4096 4096:7168 "$E"
run t24576 4096 24576:1536 "$E"
run s7168 512 7168:16384 "$E;$T=128x128:3;$T=128x256:1"
run s4096 512 4096:7168 "$E"
BULK=';FINEGEMM_GEMM_SCALE_BULK=1'
for nk in 7168:16384 4096:7168 24576:1536 7168:2048; do before 240 && run bulk_${nk/:/_} 4096 $nk "$BULK" --bf16-input; done
before 280 && for h in 1 0; do
  FINEGEMM_GEMM_HOIST_SPLIT=$h timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_h$h.jsonl 2>$W/moe_h$h.err
  echo "moe hoist=$h rc=$?"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_h$h.jsonl
done
left=$(( 560 - $(date +%s) + s0 ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic \
    --budget-s $(( left - 15 )) --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -48 $W/bench_linear.txt; tail -3 $W/bench_linear.err
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
