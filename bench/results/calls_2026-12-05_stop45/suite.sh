#!/usr/bin/env bash
# The whole GPU suite in one call (written at stop 45, not yet run; carry [".snap/prebuilt.txz", ".snap/suite.sh"] after
# scripts/pack-prebuilt; <= ~420 s): the GoogleTest binaries in shards side by side (stop 44 ran them so in calls 6-8:
# test_cuda_linear in four shards took ~79 s), then `finegemm check` and `finegemm run` on CUDA. Each part is guarded
# by the elapsed time; the summary lists every binary's pass line or its failures.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
shards() {  # binary, shard count, timeout
  for i in $(seq 0 $(( $2 - 1 ))); do
    GTEST_TOTAL_SHARDS=$2 GTEST_SHARD_INDEX=$i timeout $3 $B/tests/$1 >$W/$1_$i.log 2>&1 &
  done
}
shards test_cuda_linear 4 200
timeout 200 $B/tools/finegemm run --backend cuda >$W/run.log 2>&1 &
wait; echo "linear and run $(el)"
if left 220; then
  shards test_cuda_fp4 3 180
  timeout 120 $B/tests/test_cuda_edge >$W/edge.log 2>&1 &
  timeout 120 $B/tests/test_cuda_moe_routing >$W/routing.log 2>&1 &
  timeout 120 $B/tests/test_cuda_capture_first >$W/capture.log 2>&1 &
  timeout 120 $B/tests/test_ep_api >$W/ep.log 2>&1 &
  wait; echo "fp4, edge, routing, capture, ep $(el)"
fi
if left 360; then
  shards test_cuda_moe 3 150
  timeout 150 $B/tools/finegemm check --backend cuda >$W/check.log 2>&1 &
  wait; echo "moe and check $(el)"
fi
for f in $W/*.log; do
  printf '%-28s %s\n' "$(basename $f .log)" "$(grep -hE '^\[  (PASSED|FAILED)  \]|passed|failed' $f | tail -2 | tr '\n' ' ')"
  grep -hE "^\[  FAILED  \]|Failure" $f | head -4
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
