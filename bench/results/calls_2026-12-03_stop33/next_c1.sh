#!/usr/bin/env bash
# Prepared at stop 33 for the next session's first call (after scripts/pack-prebuilt, copy into .snap; carry
# [".snap"]; ~570 s): the whole GPU test suite on the landed commit (stop 33's call 3 cut test_cuda_moe's last test
# and the CLI checks at 290 s), then the sanitizers, which now include the TMA-store epilogue's dense configs and the
# grouped one (gpu-check sanitize). Each gpu-check keeps its own deadline, so both return their logs.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=380 timeout 390 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -12 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== gpu-check sanitize $(el)"
left=$(( 565 - ($(date +%s) - s0) ))
OUT=$W/san GPU_CHECK_DEADLINE=$left timeout $(( left + 10 )) scripts/gpu-check sanitize >$W/san.log 2>&1
echo "rc=$? $(el)"; tail -24 $W/san.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
