#!/usr/bin/env bash
# For the session after stop 37, its third call (carry [".snap"] after scripts/pack-prebuilt): the whole GPU test
# suite and the sanitizers on the binaries of the first two calls (stop 37 added the split-finish tests and the
# grouped lean bias tests, whose sanitizer steps run with FINEGEMM_TEST_QUICK=1), then, if time is left, ncu on the
# decode kernels (where the ~1 TB/s between the read pattern and the kernels goes: stall samples per SASS line).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
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
