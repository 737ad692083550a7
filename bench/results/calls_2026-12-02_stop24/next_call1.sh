#!/usr/bin/env bash
# Next session's first call (after scripts/pack-prebuilt; cp this into .snap; carry [".snap"]): stop 24's unmeasured
# split-K rule (one wave) against the old counts, wider tiles at M = 128, the no-promotion rate with 192x128 pairs,
# the MoE grouped GEMM with 64-row tiles, then the linear tests that did not run at stop 24.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
run() {  # name m n:k variant [env...]
  local name=$1 m=$2 nk=$3 v=$4; shift 4
  env "$@" FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $nk --variants $v >$W/$name.txt 2>&1
  echo "$name M=$m $nk $v $* :: $(grep -o -- '-> [^ ]*.*split_k=[0-9]*' $W/$name.txt | head -1) $(grep -o '"us": [0-9.]*\|"us_graph": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/$name.txt | head -4 | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
}
V=block-fp32-dynamic
run s4096_new 128 4096:7168 $V
run s4096_old 128 4096:7168 $V FINEGEMM_GEMM_CONFIG=128x64:3
run s576_new 128 576:7168 $V
run s576_old 128 576:7168 $V FINEGEMM_GEMM_CONFIG=128x64:15
run s576m512_new 512 576:7168 $V
run s576m512_old 512 576:7168 $V FINEGEMM_GEMM_CONFIG=128x64:4
run w24576 128 24576:1536 $V
run w24576_256 128 24576:1536 $V FINEGEMM_GEMM_CONFIG=128x256
run w24576_128 128 24576:1536 $V FINEGEMM_GEMM_CONFIG=128x128
run w32768 128 32768:512 $V
run w32768_256 128 32768:512 $V FINEGEMM_GEMM_CONFIG=128x256
run d64 64 7168:2048 $V
run d64_dec 64 7168:2048 $V FINEGEMM_FP8_DECODE=1
run np_c2 4096 7168:16384 channel-token FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=192x128:1c2
run np_c2a 4096 7168:16384 channel-token FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=192x128:1c2a
run np_1 4096 7168:16384 channel-token FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=192x128
echo "bench: $(( $(date +%s) - s0 )) s"
# The MoE row tail: 128-row tiles (default at >= 96 rows per expert) against 64-row ones.
for bm in default 64; do
  env $( [ $bm != default ] && echo FINEGEMM_GROUPED_BLOCK_M=$bm ) timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 2048,4096 --recipes dynamic --check-tokens 4 >$W/moe_bm$bm.jsonl 2>$W/moe_bm$bm.err
  echo "moe block_m=$bm rc=$? :: $(grep -o '"layer": "[a-z0-9-]*"\|"T": [0-9]*\|"layer_us": [0-9.]*\|"gemm_tflops": [0-9.]*\|"check": "[a-z]*"' $W/moe_bm$bm.jsonl | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
done
left=$(( 560 - $(date +%s) + s0 ))
[ $left -gt 30 ] && timeout $left $B/tests/test_cuda_linear --gtest_filter='-*EveryTileConfig*:*Pingpong*:*DoubleAcc*' >$W/test_lin.txt 2>&1
echo "linear tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_lin.txt | tr '\n' ' ') $(grep -c '^\[       OK' $W/test_lin.txt) ok"; grep -E "Failure" -A3 $W/test_lin.txt | head -10
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
