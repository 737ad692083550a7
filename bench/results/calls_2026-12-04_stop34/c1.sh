#!/usr/bin/env bash
# Stop 34 call 1 (carry [".snap"]: prebuilt.txz, and trace.txz = bench_cuda_linear built with FINEGEMM_GEMM_TRACE=ON):
# clock-stamp traces of one CTA of the dense GEMM (scripts/gemm-trace) at the shapes where we trail cuBLASLt, then the
# whole GPU test suite on the landed kernels (stop 33's call 3 cut its end).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
mkdir -p .trace && tar xJf trace.txz -C .trace
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
tr() {  # tr NAME M N:K ENVS
  FINEGEMM_GEMM_TRACE_FILE=$W/trace_$1.txt FINEGEMM_PRINT_CONFIG=1 timeout 40 .trace/bench_cuda_linear --m-major-scales --graph-max-m 0 \
    --m $2 --nk $3 --variants block-fp32-dynamic --envs "$4" >$W/trace_$1.jsonl 2>$W/trace_$1.err
  echo "-- $1 (M=$2 NK=$3 env=$4) rc=$? $(el)"; grep -m2 "config" $W/trace_$1.err
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("   events %.2f us rel=%.2e" % (r["us"], r["rel_err"]))' $W/trace_$1.jsonl
  python3 scripts/gemm-trace $W/trace_$1.txt 2>&1 | head -14
}
echo "== traces"
tr big_default 4096 7168:16384 ""
tr big_128c2 4096 7168:16384 "FINEGEMM_GEMM_CONFIG=128x128:1c2"
tr big_128c2_single 4096 7168:16384 "FINEGEMM_GEMM_CONFIG=128x128:1c2,FINEGEMM_GEMM_DOUBLE_ACC=0"
tr big_192_rotate 4096 7168:16384 "FINEGEMM_GEMM_ROTATE_ISSUE=1"
tr n4096_default 4096 4096:7168 ""
tr m512_default 512 4096:7168 ""
tr m512_big 512 7168:16384 ""
echo "== gpu-check test $(el)"
left=$(( 585 - ($(date +%s) - s0) ))
OUT=$W/test GPU_CHECK_DEADLINE=$left timeout $(( left + 5 )) scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -14 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
