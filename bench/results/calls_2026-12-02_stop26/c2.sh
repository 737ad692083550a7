#!/usr/bin/env bash
# Stop 26 call 2: decode and M = 128 configs, the grouped variants in the MoE layer, then the 42-shape table with
# CUDA-graph replay at every M (the honest timing at M >= 512 too).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
run() {  # name m n:k variant envs [timeout]
  FINEGEMM_PRINT_CONFIG=1 timeout ${6:-60} $B/bench/bench_cuda_linear --m $2 --nk $3 --variants $4 --envs "$5" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 $4 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*' $W/$1.err | sort | uniq | tr '\n' '|')"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-40s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/$1.txt
}
moe() {  # name envs layers tokens [timeout]
  env $2 timeout ${5:-90} $B/bench/bench_cuda_moe --layers $3 --tokens $4 --recipes dynamic --check-tokens 4 >$W/moe_$1.jsonl 2>$W/moe_$1.err
  echo "moe $1 [$2] rc=$? ($(( $(date +%s) - s0 )) s)"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_$1.jsonl
}
before() { [ $(( $(date +%s) - s0 )) -lt $1 ] || { echo "skipped (past $1 s): $*"; return 1; }; }
V=block-fp32-dynamic
run dec4096 1 4096:7168 $V ';FINEGEMM_DECODE_ROWS=128;FINEGEMM_PDL=0'
run m128 128 7168:16384 $V ';FINEGEMM_GEMM_CONFIG=128x64:1;FINEGEMM_GEMM_CONFIG=128x64:2;FINEGEMM_GEMM_CONFIG=128x128:3;FINEGEMM_GEMM_CONFIG=64x128:2'
before 200 && moe def '' deepseek-v3,qwen3-30b-a3b 4096
before 200 && moe pairs FINEGEMM_GROUPED_CLUSTER=1 deepseek-v3,qwen3-30b-a3b 4096
before 200 && moe nmajor FINEGEMM_GROUPED_ORDER=n deepseek-v3,qwen3-30b-a3b 4096
before 200 && moe ybf16 FINEGEMM_MOE_Y=bf16 deepseek-v3,qwen3-30b-a3b 4096
left=$(( 545 - $(date +%s) + s0 ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants $V \
    --budget-s $(( left - 15 )) --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -48 $W/bench_linear.txt; tail -3 $W/bench_linear.err
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
