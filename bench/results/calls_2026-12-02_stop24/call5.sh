#!/usr/bin/env bash
# Stop 24 call 5: split-K at M = 128 (the heuristic's ceil(SMs / tiles) gives 2 waves: 3 splits of 56 tiles = 168
# units) against forced splits that fill one wave, and wider tiles at M = 128 for N = 24576 / 32768.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
run() {  # name m n:k [config]
  env $( [ -n "$4" ] && echo FINEGEMM_GEMM_CONFIG=$4 ) FINEGEMM_PRINT_CONFIG=1 timeout 30 $B/bench/bench_cuda_linear --m $2 --nk $3 --variants block-fp32-dynamic >$W/$1.txt 2>&1
  echo "$1 M=$2 $3 ${4:-default} :: $(grep -o -- '-> [^ ]*' $W/$1.txt | head -1) $(grep -o '"us": [0-9.]*\|"us_graph": [0-9.]*\|"rel_err": [-0-9.e]*' $W/$1.txt | head -3 | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
}
run a0 128 7168:2048
run a1 128 7168:2048 128x128:2
run b0 128 7168:16384
run b1 128 7168:16384 128x128:2
run c0 128 4096:7168
run c1 128 4096:7168 128x128:4
run d0 128 2112:7168
run d1 128 2112:7168 128x128:7
run e0 128 24576:1536
run e1 128 24576:1536 128x192
run e2 128 24576:1536 128x256
run f0 128 32768:512
run f1 128 32768:512 128x256
FINEGEMM_FP8_DECODE=1 timeout 30 $B/bench/bench_cuda_linear --m 64 --nk 7168:2048 --variants block-fp32-dynamic >$W/g1.txt 2>&1
echo "g1 M=64 7168:2048 FP8_DECODE=1 :: $(grep -o '"us": [0-9.]*\|"us_graph": [0-9.]*\|"rel_err": [-0-9.e]*' $W/g1.txt | head -3 | tr '\n' ' ')"
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
