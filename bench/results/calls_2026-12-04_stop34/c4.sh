#!/usr/bin/env bash
# Stop 34 call 4 (carry [".snap"]: prebuilt.txz with the lookahead K loop on by default): the whole GPU test suite on
# the new default (the grouped 192-row kernels take the lookahead too), then the 42 shapes against cuBLASLt.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=320 timeout 328 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -13 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== 42 shapes $(el)"
left=$(( 585 - ($(date +%s) - s0) ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; grep -E "geomean" $W/linear42.log
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["m"] >= 128: print("  M=%-4d N=%-6d K=%-6d %8.2f us vs cuBLASLt %8.2f  x%.3f" % (r["m"], r["n"], r["k"], min(r["us"], r["us_graph"] or 1e9), min(r["cublas_us"], r["cublas_us_graph"] or 1e9), r["speedup_vs_cublas"]))
' $W/linear42.json
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
