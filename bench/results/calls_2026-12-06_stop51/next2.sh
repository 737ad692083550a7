#!/usr/bin/env bash
# The next session's second call (written at stop 51's end; carry [".snap/prebuilt.txz", ".snap/next2.sh"]; <= ~300 s):
# test_cuda_moe whole on the current commit, in three shards side by side with 280 s each (stop 51's suite gave its
# first shard 150 s, which ran out in DecodeSplitFinishSameBits after five passed tests).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 0 1 2; do GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 280 $B/tests/test_cuda_moe >$W/moe_$i.log 2>&1 & done
wait
for i in 0 1 2; do echo "test_cuda_moe shard $i: $(grep -hE '^\[  (PASSED|FAILED)  \]' $W/moe_$i.log | tr '\n' ' ') last: $(grep -hE '^\[ RUN|^\[       OK' $W/moe_$i.log | tail -1)"; done
grep -hE "^\[  FAILED  \]|Failure" $W/moe_*.log | head -6
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
