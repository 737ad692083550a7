#!/usr/bin/env bash
# Stop 59, call 4 (the warm machine of call 3): the FP8 layer without and with the scale prefetch at other sizes:
# DeepSeek-V3 T = 16384 and 2048, Qwen3-30B-A3B T = 4096; two interleaved rounds.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
one() {
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 40 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-16s T=%-5d %-20s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  one fp8_16k_new_$round deepseek-v3 16384 dynamic X=1
  one fp8_16k_pf1_$round deepseek-v3 16384 dynamic FINEGEMM_LEAN_SCALE_PREFETCH=1
  one fp8_2k_new_$round deepseek-v3 2048 dynamic X=1
  one fp8_2k_pf1_$round deepseek-v3 2048 dynamic FINEGEMM_LEAN_SCALE_PREFETCH=1
  one qwen_4k_new_$round qwen3-30b-a3b 4096 dynamic X=1
  one qwen_4k_pf1_$round qwen3-30b-a3b 4096 dynamic FINEGEMM_LEAN_SCALE_PREFETCH=1
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
