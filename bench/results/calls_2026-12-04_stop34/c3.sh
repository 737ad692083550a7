#!/usr/bin/env bash
# Stop 34 call 3 (carry [".snap"]: prebuilt.txz with the lookahead K loop, FINEGEMM_GEMM_LOOKAHEAD=1, off): its test,
# then default vs lookahead (with the release before the next issue, after it, and early) on the shapes whose
# picks run single-accumulator loops (192x128), and 192x128 forced at shapes whose default is 128x128 with two
# accumulator sets (which the lookahead does not serve); same process and data per shape.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== LookaheadSameBits"
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LookaheadSameBits' >$W/test_lookahead.log 2>&1
echo "rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Which is|Expected|same_bits" $W/test_lookahead.log | head -12
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d %-72s ev=%8.2f graph=%8.2f us tf=%6.0f rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"] or 0, 2e-6*r["m"]*r["n"]*r["k"]/min(r["us"], r["us_graph"] or 1e9), r["rel_err"]))
' $1; }
L=FINEGEMM_GEMM_LOOKAHEAD=1
E1=";$L;$L,FINEGEMM_GEMM_DEFER_RELEASE=1;$L,FINEGEMM_GEMM_EARLY_RELEASE=1;;$L"
C=FINEGEMM_GEMM_CONFIG=192x128:1c2
E2=";$C;$C,$L;$C,$L,FINEGEMM_GEMM_EARLY_RELEASE=1;;$C,$L"
ab() {  # ab NAME M N:K ENVS
  [ $(( $(date +%s) - s0 )) -lt 540 ] || { echo "skip $1 $(el)"; return; }
  FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $2 --nk $3 --variants block-fp32-dynamic --envs "$4" >$W/ab_$1.jsonl 2>$W/ab_$1.err
  echo "-- $1 rc=$? $(el) $(grep -m1 -o 'config[^,]*' $W/ab_$1.err)"; show $W/ab_$1.jsonl
}
echo "== A/B $(el)"
ab big 4096 7168:16384 "$E1"
ab n24576 4096 24576:1536 "$E1"
ab n7168k2048 4096 7168:2048 "$E1"
ab n4096 4096 4096:7168 "$E2"
ab m512 512 4096:7168 "$E2"
ab m512big 512 7168:16384 "$E2"
ab m512n24576 512 24576:1536 "$E1"
ab n2112 4096 2112:7168 "$E1"
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
