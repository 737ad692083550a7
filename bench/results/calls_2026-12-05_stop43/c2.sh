#!/usr/bin/env bash
# Stop 42, call 2 (stop 40's c2.sh run from the repository root: carry [".snap/prebuilt.txz", ".snap/c2.sh"] after
# scripts/pack-prebuilt; the whole .snap no longer fits the carry limit beside the tree): the whole GPU test suite and
# the sanitizers on the prebuilt binaries (not run since stop 36).
cd "$(dirname "$0")/.."
mkdir -p .snap/.prebuilt && tar xJf .snap/prebuilt.txz -C .snap/.prebuilt; export FINEGEMM_PREBUILT=.snap/.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=320 timeout 330 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -13 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== gpu-check sanitize $(el)"
left=$(( 560 - ($(date +%s) - s0) ))
OUT=$W/san GPU_CHECK_DEADLINE=$(( left - 10 )) timeout $left scripts/gpu-check sanitize >$W/san.log 2>&1
echo "rc=$? $(el)"; grep -E "compute-sanitizer" $W/san.log | tail -30
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
