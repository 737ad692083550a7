#!/usr/bin/env bash
# Stop 27 call 6: the GPU test binaries with the stop 27 defaults (hoisted split, bulk A scales), the slow linear
# cases (AllRecipes*, ClustersOfFourAcrossTiles) left out for time.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
t() {  # binary timeout [filter]
  timeout $2 $B/tests/$1 ${3:+--gtest_filter=$3} >$W/$1.txt 2>&1
  echo "$1 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $W/$1.txt | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' $W/$1.txt | head
}
t test_cuda_moe_routing 40
t test_cuda_moe 90
t test_cuda_fp4 60
t test_cuda_edge 60 '-*ClustersOfFour*'
t test_cuda_capture_first 30
t test_cuda_linear 100 '-*AllRecipes*:*ClustersOfFour*'
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
