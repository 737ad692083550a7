#!/usr/bin/env bash
# Stop 30 call 5 (env switches only, binaries of f0f1ca2): call 4 had 64x128 tiles 6% ahead of the heuristic's 64x64
# at M = 64 N = 24576 K = 1536 (16.10 vs 17.06 us); the other M <= 64 shapes where the 64-wide pick has a full wave
# at 128 wide too, before the heuristic changes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d env=%-30s graph=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
C=FINEGEMM_GEMM_CONFIG
for s in 64:24576:1536 48:24576:1536 64:32768:512 48:32768:512 64:16384:1536 40:24576:2048; do
  IFS=: read -r m n k <<<"$s"
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$C=64x128:1;;$C=64x128:1" >$W/cfg_${m}_${n}.txt 2>$W/cfg_${m}_${n}.err
  echo "== M=$m N=$n K=$k rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/cfg_${m}_${n}.err | head -1)"; show $W/cfg_${m}_${n}.txt
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
