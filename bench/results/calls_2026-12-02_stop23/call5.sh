#!/usr/bin/env bash
# stop 23 call 5 (short): 2-CTA clusters after the relaxed remote arrive: same-bits test and bench.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
timeout 60 $B/tests/test_cuda_linear --gtest_filter='*DoubleAcc*' >$W/test.txt 2>&1
echo "test DoubleAcc (incl. 128x128:1c2) rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"
for shape in 4096:4096:7168 4096:7168:16384; do for cfg in 128x128 128x128:1c2 128x256:1c2; do
  IFS=: read -r m n k <<<"$shape"
  FINEGEMM_GEMM_CONFIG=$cfg timeout 30 $B/bench/bench_cuda_linear --m $m --nk $n:$k >$W/cfg_${cfg}_$shape.txt 2>&1
  echo "cfg $cfg $shape :: $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/cfg_${cfg}_$shape.txt | head -3 | tr '\n' ' ')"
  [ $(( $(date +%s) - s0 )) -gt 100 ] && break 2
done; done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
