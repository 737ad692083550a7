#!/usr/bin/env bash
# Stop 34 call 1 (carry [".snap"]: prebuilt.txz of a7dad42, the landed kernels plus the trace build option, off): the
# whole GPU test suite (stop 33's call 3 cut its end at 290 s).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=560 timeout 570 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -14 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
