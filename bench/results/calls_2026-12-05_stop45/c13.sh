#!/usr/bin/env bash
# Stop 45, call 13 (carry [".snap/prebuilt.txz", ".snap/c13.sh"]; <= ~90 s; the session's last ~260 s of device time):
# the FP4 decode consumers pipelined over two stages (FINEGEMM_FP4_DECODE_PIPE=1, 0af5620): its test, then its A/B.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 40 $B/tests/test_cuda_fp4 --gtest_filter='*ExactPipelinedDecode/cuda:*ExactRandomSpreadsWithKTail/cuda' >$W/fp4.log 2>&1
echo "tests rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|never ran" $W/fp4.log | head -8; tail -n 1 $W/fp4.log
timeout 40 $B/bench/bench_cuda_linear --m 1,16,64 --nk 7168:16384,4096:7168 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_PIPE=1" >$W/pipe.jsonl 2>$W/pipe.err
echo "-- FP4 decode, default and pipelined $(el)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d %-28s graph=%7.2f us ev=%7.2f rel=%.1e" % (r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))' $W/pipe.jsonl
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
