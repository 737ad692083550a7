#!/usr/bin/env bash
# Stop 60, call 4 (the budget's last minutes; LIMIT=<s>): issue 5's MoE prefill ratio on the bars' card, DeepSeek-V3
# T = 4096, FP8 (the default) against FP4 as it is and with the kept fold scans (FINEGEMM_FP4_SCAN_CACHE=1, as
# RunOptions::weights_constant does), interleaved rounds while time is left.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w4; mkdir -p $W; LIMIT=${LIMIT:-200}
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
one() {
  local name=$1 L=$2 T=$3 r=$4; shift 4
  env "$@" timeout 40 $B/bench/bench_cuda_moe --layers $L --tokens $T --recipes $r --check-tokens 1 >$W/$name.jsonl 2>$W/$name.err
  grep -h '^{' $W/$name.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-14s T=%-5d %-20s layer %8.1f us gemm %6.1f TF/s %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r["gemm_tflops"], r["check"]))' $name
}
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2 3 4; do
  left $(( LIMIT - 60 )) || break
  one fp8_$round deepseek-v3 4096 dynamic X=1
  one fp4_$round deepseek-v3 4096 fp4 X=1
  one fp4_sc1_$round deepseek-v3 4096 fp4 FINEGEMM_FP4_SCAN_CACHE=1
done
cd $OUT && tar czf all4.tgz w4 && rm -rf w4
echo "total $(( $(date +%s) - s0 )) s"
