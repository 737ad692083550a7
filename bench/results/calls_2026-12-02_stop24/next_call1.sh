#!/usr/bin/env bash
# Next session's first call (after scripts/pack-prebuilt; cp this into .snap; carry [".snap"]): stop 24's unmeasured
# split-K rule (one wave) against the old counts, wider tiles at M = 128, the decode kernel at M = 64, the
# no-promotion rate of 192x128 pairs (bench_cuda_linear --envs: every setting on the same data, each row checked
# against the CPU reference), the wide lean stores, the MoE grouped GEMM with 64- and 192-row tiles and with wide
# stores, then the linear tests stop 24 did not rerun.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
run() {  # name m n:k variant envs
  FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m $2 --nk $3 --variants $4 --envs "$5" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 $4 rc=$? ($(( $(date +%s) - s0 )) s); configs: $(grep -o -- '-> .*' $W/$1.err | sort | uniq | tr '\n' '|')"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        print("  env=%-70s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/$1.txt
}
V=block-fp32-dynamic
run split4096 128 4096:7168 $V ';FINEGEMM_GEMM_CONFIG=128x64:3'
run split576 128 576:7168 $V ';FINEGEMM_GEMM_CONFIG=128x64:15'
run split576m512 512 576:7168 $V ';FINEGEMM_GEMM_CONFIG=128x64:4'
run wide24576 128 24576:1536 $V ';FINEGEMM_GEMM_CONFIG=128x256;FINEGEMM_GEMM_CONFIG=128x128'
run wide32768 128 32768:512 $V ';FINEGEMM_GEMM_CONFIG=128x256'
run dec64 64 7168:2048 $V ';FINEGEMM_FP8_DECODE=1'
run nopromote 4096 7168:16384 channel-token 'FINEGEMM_GEMM_FP32_ACCUM=0,FINEGEMM_GEMM_CONFIG=192x128:1c2;FINEGEMM_GEMM_FP32_ACCUM=0,FINEGEMM_GEMM_CONFIG=192x128:1c2a;FINEGEMM_GEMM_FP32_ACCUM=0,FINEGEMM_GEMM_CONFIG=192x128'
# The wide lean stores (FINEGEMM_GEMM_WIDE_STORES=1, off by default): same bits first, then the short-K shapes.
timeout 120 $B/tests/test_cuda_linear --gtest_filter='*WideStoresSameBits*' >$W/test_wide.txt 2>&1
echo "wide-stores test rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_wide.txt | tr '\n' ' ')"; grep -E "Failure" -A3 $W/test_wide.txt | head -8
for nk in 32768:512 24576:1536 7168:2048 7168:16384; do
  run wide_${nk/:/_} 4096 $nk $V ';FINEGEMM_GEMM_WIDE_STORES=1'
done
echo "bench: $(( $(date +%s) - s0 )) s"
# The MoE row tail: 128-row tiles (default at >= 96 rows per expert) against 64- and 192-row ones (tested first).
timeout 120 $B/tests/test_cuda_moe --gtest_filter='*GroupedTileHeights*:*LeanEpilogueAndIdleSkip*' >$W/test_heights.txt 2>&1
echo "tile-height test rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_heights.txt | tr '\n' ' ')"; grep -E "Failure|rel=" $W/test_heights.txt | head -6
for bm in default 64 192 wide; do
  env $( [ $bm = wide ] && echo FINEGEMM_GEMM_WIDE_STORES=1 ) $( [ $bm != default ] && [ $bm != wide ] && echo FINEGEMM_GROUPED_BLOCK_M=$bm ) timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 2048,4096 --recipes dynamic --check-tokens 4 >$W/moe_bm$bm.jsonl 2>$W/moe_bm$bm.err
  echo "moe block_m=$bm rc=$? :: $(grep -o '"layer": "[a-z0-9-]*"\|"T": [0-9]*\|"layer_us": [0-9.]*\|"gemm_tflops": [0-9.]*\|"check": "[a-z]*"' $W/moe_bm$bm.jsonl | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
done
# FP4 experts at T = 4096: in-kernel expansion (default) against the touched experts expanded to E4M3 first (the FP8
# layer took 5.6 ms against FP4's 13.5 at stop 24).
for x in default 64; do
  env $( [ $x != default ] && echo FINEGEMM_FP4_EXPAND_GROUPED_ROWS=$x ) timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 4 >$W/moe_fp4x$x.jsonl 2>$W/moe_fp4x$x.err
  echo "moe fp4 expand=$x rc=$? :: $(grep -o '"layer_us": [0-9.]*\|"gemm_tflops": [0-9.]*\|"check": "[a-z]*"' $W/moe_fp4x$x.jsonl | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
done
left=$(( 560 - $(date +%s) + s0 ))
[ $left -gt 30 ] && timeout $left $B/tests/test_cuda_linear --gtest_filter='-*EveryTileConfig*:*Pingpong*:*DoubleAcc*' >$W/test_lin.txt 2>&1
echo "linear tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_lin.txt | tr '\n' ' ') $(grep -c '^\[       OK' $W/test_lin.txt) ok"; grep -E "Failure" -A3 $W/test_lin.txt | head -10
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
