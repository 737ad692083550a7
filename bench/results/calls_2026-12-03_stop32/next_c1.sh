#!/usr/bin/env bash
# Prepared at stop 32 for the next session's first call (after scripts/pack-prebuilt, copy into .snap; carry
# [".snap"]; ~560 s): the whole GPU test suite on the FastDiv tile order and the thread-release default (stop 32 ran
# only test_cuda_linear's dense-kernel tests to the end, and 300 s of the rest without a failure), then every compiled
# dense config on the shapes under 1.0x cuBLASLt at stop 32 (the tile change got cheaper, so the heuristic's picks may
# have moved; FINEGEMM_PRINT_CONFIG logs the default's pick).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test timeout 300 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -12 $W/test.log
show() { python3 -c '
import json, sys
best = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); e = (r["env"] or "default").replace("FINEGEMM_GEMM_CONFIG=","")
        print("  M=%-4d N=%-6d K=%-6d %-14s graph=%8.2f us rel=%.2e" % (r["m"], r["n"], r["k"], e, r["us_graph"], r["rel_err"]))
' $1; }
C=FINEGEMM_GEMM_CONFIG
envs=";$C=192x128:1c2;$C=192x128:1c2a;$C=192x128:1;$C=128x128:1;$C=128x128:1c2;$C=128x128:1c2a;$C=128x64:1;$C=64x128:1;$C=128x192:1;$C=128x256:1c2;$C=128x128:2;"
for s in 128:32768:512 128:24576:1536 512:7168:2048 512:4096:7168 512:24576:1536 512:2112:7168 512:32768:512 512:7168:16384 4096:7168:2048 4096:4096:7168 4096:7168:16384; do
  [ $(( $(date +%s) - s0 )) -lt 480 ] || break
  IFS=: read -r m n k <<<"$s"
  FINEGEMM_PRINT_CONFIG=1 timeout 100 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs "$envs" >$W/cfg_${m}_${n}_${k}.txt 2>$W/cfg_${m}_${n}_${k}.err
  echo "== M=$m N=$n K=$k rc=$? $(el) default pick: $(grep -m1 'finegemm: gemm' $W/cfg_${m}_${n}_${k}.err | sed 's/.*-> //')"; show $W/cfg_${m}_${n}_${k}.txt
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
