#!/usr/bin/env bash
# Next session's first call (after scripts/pack-prebuilt; copy this into .snap; carry [".snap"]): the 2-CTA clusters
# after dde513b (no membar before the remote stage release), the new 192x128 pairs and the shared-A pairs (c2a): tests,
# then each cluster
# config against the default at the prefill shapes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
timeout 200 $B/tests/test_cuda_linear --gtest_filter='*EveryTileConfig*:*DoubleAcc*:*Pingpong*:*SharedA*:GemmConfig*' >$W/test.txt 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -E "Failure|Expected|Which is" $W/test.txt | head -10
for shape in 4096:7168:16384 4096:4096:7168 4096:24576:1536 2048:7168:16384 4096:2112:7168; do
  for cfg in default 128x128:1c2 192x128:1c2 128x128:1c2a 192x128:1c2a 128x256:1c2; do
    IFS=: read -r m n k <<<"$shape"
    env $( [ $cfg != default ] && echo FINEGEMM_GEMM_CONFIG=$cfg ) FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k >$W/cfg_${cfg}_$shape.txt 2>&1
    echo "cfg $cfg $shape :: $(grep -o -- '-> [^ ]*\|[0-9]* clusters of 2 fit at once' $W/cfg_${cfg}_$shape.txt | head -2 | tr '\n' ' ') $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/cfg_${cfg}_$shape.txt | head -3 | tr '\n' ' ')"
    [ $(( $(date +%s) - s0 )) -gt 520 ] && break 2
  done
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
