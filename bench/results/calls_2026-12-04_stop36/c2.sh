#!/usr/bin/env bash
# Stop 36 call 2 (carry [".snap"]): the lean kernel as the default (lean_gemm_block_m) with static activations served.
# Its same-bits test and the tile-height picks, then LEAN=0/1/256 at M = 128, 512, 4096 on the 7 bar shapes (same
# process and data), then the 42 shapes against cuBLASLt with the new default.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits:GemmConfig.*' >$W/lean_test.log 2>&1
rc=$?; echo "LeanKernelSameBits rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|lean kernel did not|took the lean" $W/lean_test.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-10s ev=%8.2f graph=%8.2f us %7.1f TF rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"] or 0, r["tflops"], r["rel_err"]))
' $1; }
E="FINEGEMM_GEMM_LEAN=0;FINEGEMM_GEMM_LEAN=1;FINEGEMM_GEMM_LEAN=256"
for s in 7168:16384 4096:7168 7168:2048 24576:1536 2112:7168 32768:512 576:7168; do
  [ $(( $(date +%s) - s0 )) -lt 260 ] || break
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 128,512,4096 --nk $s --variants block-fp32-dynamic --envs "$E" >$W/ab_${s/:/_}.jsonl 2>/dev/null
  echo "-- $s $(el)"; show $W/ab_${s/:/_}.jsonl
done
left=$(( 585 - ($(date +%s) - s0) ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "42 shapes rc=$? $(el)"; grep -E "geomean" $W/linear42.log
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["m"] >= 128: print("  M=%-4d N=%-6d K=%-6d %8.2f us vs cuBLASLt %8.2f  x%.3f" % (r["m"], r["n"], r["k"], min(r["us"], r["us_graph"] or 1e9), min(r["cublas_us"], r["cublas_us_graph"] or 1e9), r["speedup_vs_cublas"]))
' $W/linear42.json
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
