#!/usr/bin/env bash
# Stop 58, call 4 (H200): the grouped lean kernel's 192-row tiles (FINEGEMM_GROUPED_LEAN=192) against the default
# (the general kernel below 256 rows per expert) on FP8 experts, interleaved, three rounds: DeepSeek-V3 at 96 / 128 /
# 192 rows per expert (T = 3072 / 4096 / 6144), Qwen3-30B-A3B at 128 rows (T = 2048); the recipes dynamic, ue8m0, static at T = 4096.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
one() {  # name layer T recipes env...
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 80 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-26s %-14s T=%-5d %-22s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r.get("layer","?"), r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2 3; do
  echo "-- round $round $(el)"
  for T in 3072 4096 6144; do
    one dsv3_${T}_def_$round deepseek-v3 $T dynamic X=1
    one dsv3_${T}_l192_$round deepseek-v3 $T dynamic FINEGEMM_GROUPED_LEAN=192
  done
  one qwen_2048_def_$round qwen3-30b-a3b 2048 dynamic X=1
  one qwen_2048_l192_$round qwen3-30b-a3b 2048 dynamic FINEGEMM_GROUPED_LEAN=192
done
echo "-- recipes at T = 4096 $(el)"
one rec_def deepseek-v3 4096 ue8m0,static X=1
one rec_l192 deepseek-v3 4096 ue8m0,static FINEGEMM_GROUPED_LEAN=192
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
