#!/usr/bin/env bash
# Stop 28 call 3: tile and split-K sweep at M = 128 and 512 over the seven (N, K) of RECIPES.md, M-major scales (as
# bench/linear.py), every setting on the same data in one process, graph replay: the heuristic's picks against
# 64-row tiles and split-K where the 15 shapes under 1.0x cuBLASLt sit.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-34s us=%8.2f graph=%7.2f rel=%.2e" % ((r["env"] or "default").replace("FINEGEMM_GEMM_CONFIG=","cfg="), r["us"], r["us_graph"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_CONFIG
for m in 128 512; do
  for nk in 2112:7168 24576:1536 32768:512 7168:16384 4096:7168 7168:2048 576:7168; do
    [ $(( $(date +%s) - s0 )) -lt 320 ] || { echo "skipped M=$m $nk"; continue; }
    E=";$T=64x128:1;$T=64x128:2;$T=128x64:1;$T=128x64:2;$T=128x128:1;$T=128x128:2"
    [ $m = 512 ] && E="$E;$T=192x128:1;$T=128x128:3"
    FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $nk --variants block-fp32-dynamic --envs "$E" >$W/s_${m}_${nk/:/_}.txt 2>$W/s_${m}_${nk/:/_}.err
    echo "== M=$m $nk rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/s_${m}_${nk/:/_}.err | head -1)"; show $W/s_${m}_${nk/:/_}.txt
  done
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
