#!/usr/bin/env bash
# Stop 40, call 2 (stop 37's next_c3.sh; carry [".snap"] after scripts/pack-prebuilt): the whole GPU test suite and the
# sanitizers (not run since stop 36; ScopedEnv's end-of-scope change, the FP4 lean default, the batched expansion and the
# crafted-spread bar all land in it).
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
