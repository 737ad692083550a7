#!/usr/bin/env bash
# Stop 42, call 4 (carry [".snap/prebuilt.txz", ".snap/c4.sh"]; ~150 s): the smallest call that still decides
# something, for when the budget has no room for c1.sh: the permuted FP4 decode's exactness test (quick), its A/B at
# the decode bar's shape (M = 1 / 16 / 64, N = 7168 K = 16384, --bf16-input, FP8 beside), and the split-K finish A/B
# at issue 3's two decode shapes furthest from 3.0 TB/s (N = 4096 K = 7168, N = 24576 K = 1536).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
FINEGEMM_TEST_QUICK=1 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactPermutedDecode/cuda' >$W/perm_test.log 2>&1
echo "-- perm test rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|Which is|Expected" $W/perm_test.log | head -8
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-20s M=%-3d N=%-6d K=%-6d %-32s graph=%8.2f us %6.2f TB/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, (r.get("gbps") or 0) / 1000, r["rel_err"]))
' $1; }
timeout 40 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk 7168:16384 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_PERM=1" >$W/perm.jsonl 2>$W/perm.err
timeout 25 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk 7168:16384 --variants block-fp32-dynamic >$W/fp8b.jsonl 2>$W/fp8b.err
echo "-- FP4 default / permuted, FP8 (bf16 input) $(el)"; show $W/perm.jsonl; show $W/fp8b.jsonl; tail -qn 1 $W/perm.err
timeout 40 $B/bench/bench_cuda_linear --m 1,16,64 --nk 4096:7168,24576:1536 --variants block-fp32-dynamic --envs ";FINEGEMM_DECODE_SPLIT_FINISH=1" >$W/fin.jsonl 2>$W/fin.err
echo "-- FP8 decode default / split finish $(el)"; show $W/fin.jsonl; tail -n 1 $W/fin.err
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
