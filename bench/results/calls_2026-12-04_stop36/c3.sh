#!/usr/bin/env bash
# Stop 36 call 3 (carry [".snap"]): the lean kernel's default picked by the cost model (lean_gemm_block_m). The whole
# GPU test suite, the 42 shapes against cuBLASLt, then static and UE8M0 recipes against the dynamic FP32 one.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=290 timeout 298 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -13 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== 42 shapes $(el)"
left=$(( 540 - ($(date +%s) - s0) ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; grep -E "geomean" $W/linear42.log
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["m"] >= 128 or r["speedup_vs_cublas"] < 1.0: print("  M=%-4d N=%-6d K=%-6d %8.2f us vs cuBLASLt %8.2f  x%.3f" % (r["m"], r["n"], r["k"], min(r["us"], r["us_graph"] or 1e9), min(r["cublas_us"], r["cublas_us_graph"] or 1e9), r["speedup_vs_cublas"]))
' $W/linear42.json
left=$(( 590 - ($(date +%s) - s0) ))
if [ $left -gt 15 ]; then
  timeout $left $B/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk 7168:16384 --variants block-fp32-dynamic,block-fp32-static,block-ue8m0-dynamic >$W/recipes.jsonl 2>/dev/null
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-22s M=%-4d N=%-6d K=%-6d ev=%8.2f graph=%8.2f us rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], r["us"], r["us_graph"] or 0, r["rel_err"]))
' $W/recipes.jsonl
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
