#!/usr/bin/env bash
# Stop 52, call 7 (carry [".snap/prebuilt.txz", ".snap/c5.sh"]; <= ~230 s), binaries of 3c74a61: the rest of
# test_cuda_moe (call 6 ran its seven grouped tests) in three parallel shards, beside `finegemm check --backend cuda`
# and `finegemm run --backend cuda`, with the grouped lean kernel the default from 256 rows per expert.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
F='-*GroupedLean*:*SharedAPairs*:*TmaStore*:*TileHeights*'
for i in 0 1 2; do
  GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 210 $B/tests/test_cuda_moe --gtest_filter="$F" >$W/test_cuda_moe_$i.log 2>&1 &
done
timeout 210 $B/tools/finegemm check --backend cuda >$W/check.log 2>&1 &
timeout 210 $B/tools/finegemm run --backend cuda >$W/run.log 2>&1 &
wait
echo "done ($(( $(date +%s) - s0 )) s)"
for f in $W/*.log; do
  printf '%-22s %s\n' "$(basename $f .log)" "$(grep -hE '^\[  (PASSED|FAILED)  \]|passed|failed' $f | tail -2 | tr '\n' ' ')"
  grep -hE "^\[       OK|^\[  FAILED  \]|Failure" $f | head -8
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
