#!/usr/bin/env bash
# Stop 34 call 2 (carry [".snap"]: prebuilt.txz of the landed kernels, trace.txz = bench_cuda_linear built with
# FINEGEMM_GEMM_TRACE=ON): clock-stamp traces of CTA 0 of the dense GEMM (scripts/gemm-trace) at the shapes where we
# trail cuBLASLt, then gpu-check sanitize (the TMA-store tests under memcheck and racecheck for the first time).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
mkdir -p .trace && tar xJf trace.txz -C .trace
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
tr() {  # tr NAME M N:K ENVS
  FINEGEMM_GEMM_TRACE_FILE=$W/trace_$1.txt FINEGEMM_PRINT_CONFIG=1 timeout 40 .trace/bench_cuda_linear --m-major-scales --graph-max-m 0 \
    --m $2 --nk $3 --variants block-fp32-dynamic --envs "$4" >$W/trace_$1.jsonl 2>$W/trace_$1.err
  echo "-- $1 (M=$2 NK=$3 env=$4) rc=$? $(el)"; grep -m1 "config" $W/trace_$1.err
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("   events %.2f us rel=%.2e" % (r["us"], r["rel_err"]))' $W/trace_$1.jsonl
  python3 scripts/gemm-trace $W/trace_$1.txt 2>&1 | head -12
}
echo "== traces"
tr big_default 4096 7168:16384 ""
tr big_128c2_single 4096 7168:16384 "FINEGEMM_GEMM_CONFIG=128x128:1c2,FINEGEMM_GEMM_DOUBLE_ACC=0"
tr big_192_rotate 4096 7168:16384 "FINEGEMM_GEMM_ROTATE_ISSUE=1"
tr n4096_default 4096 4096:7168 ""
tr m512_single 512 4096:7168 "FINEGEMM_GEMM_DOUBLE_ACC=0"
tr m512_big 512 7168:16384 "FINEGEMM_GEMM_DOUBLE_ACC=0"
echo "== gpu-check sanitize $(el)"
left=$(( 580 - ($(date +%s) - s0) ))
OUT=$W/san GPU_CHECK_DEADLINE=$left timeout $(( left + 5 )) scripts/gpu-check sanitize >$W/san.log 2>&1
echo "rc=$? $(el)"; tail -24 $W/san.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
