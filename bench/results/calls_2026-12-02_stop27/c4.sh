#!/usr/bin/env bash
# Stop 27 call 4: the three recipes of the bars (FP32 / UE8M0 dynamic, static) with the new defaults at M = 128, 512
# and 4096 (both sides M-major activation scales), then tile configs at M = 128 and 512 where cuBLASLt still leads.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-44s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_CONFIG
E=";$T=128x128:1;$T=128x128:1c2;$T=192x128:1c2;$T=128x64:1;$T=128x256:1c2;$T=64x128:1"
for job in "512 24576:1536" "512 32768:512" "512 7168:2048" "128 32768:512" "128 24576:1536" "128 7168:2048"; do
  set -- $job
  FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $1 --nk $2 --variants block-fp32-dynamic --envs "$E" >$W/cfg_$1_${2/:/_}.txt 2>$W/cfg_$1_${2/:/_}.err
  echo "== cfg M=$1 $2 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*' $W/cfg_$1_${2/:/_}.err | sort | uniq | tr '\n' '|')"; show $W/cfg_$1_${2/:/_}.txt
done
left=$(( 480 - $(date +%s) + s0 ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 128,512,4096 \
    --variants block-fp32-dynamic,block-ue8m0-dynamic,block-fp32-static \
    --budget-s $(( left - 15 )) --out "$W/linear_recipes_$(date -u +%Y-%m-%d).json" >$W/bench_recipes.txt 2>$W/bench_recipes.err
echo "recipes rc=$? ($(( $(date +%s) - s0 )) s)"; tail -66 $W/bench_recipes.txt | grep -v "^torch"; tail -3 $W/bench_recipes.err
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
