#!/usr/bin/env bash
# Stop 52, call 4 (carry [".snap/prebuilt.txz", ".snap/c4.sh"]; <= ~260 s), binaries of 3c74a61 (the grouped lean
# default stands aside where a general-kernel switch is set): test_cuda_moe's grouped tests (lean default, tile
# heights, shared-A pairs with the n-major order at T = 900, TMA store), then the routing, capture and EP tests.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 $B/tests/test_cuda_moe --gtest_filter='*GroupedLean*:*SharedAPairs*:*TmaStore*:*TileHeights*' >$W/test_moe.txt 2>&1
echo "-- test_cuda_moe grouped rc=$? $(el)"
grep -E "^\[       OK|^\[  FAILED|^\[  PASSED|tests ran" $W/test_moe.txt | head -20
for t in test_cuda_moe_routing test_cuda_capture_first test_ep_api; do
  timeout 40 $B/tests/$t >$W/$t.txt 2>&1; echo "-- $t rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)" $W/$t.txt
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
