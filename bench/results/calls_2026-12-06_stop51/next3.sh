#!/usr/bin/env bash
# A later call (written at stop 51's end; carry [".snap/prebuilt.txz", ".snap/next3.sh"]; <= ~400 s): issue 4's
# T = 16384 bar (the DeepSeek-V3 FP8 layer's expert GEMMs at 1250 TFLOP/s; 728 at stop 49) against switches never
# timed at that size, where each expert has ~512 rows (the dense lean kernel ran M = 512 N = 4096 K = 7168 at ~1250
# TFLOP/s, stop 36, against the grouped general kernel's ~730 over the layer): the grouped lean kernel at 128, 192 and
# 256 rows (FINEGEMM_GROUPED_LEAN; at T = 2048 / 4096 it was not faster, stop 39), and BF16 y (FINEGEMM_MOE_Y=bf16:
# the down GEMM's output and the combine's input halved, 940 MB of F32 at T = 4096, 3.8 GB at T = 16384). Each
# layer checked against the CPU reference.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
moe() {  # name, env...
  local name=$1; shift
  env "$@" timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic --check-tokens 1 >$W/moe_$name.log 2>&1
  echo "-- MoE $name ($*) $(el)"; grep -h '^{' $W/moe_$name.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s permute=%.1f combine=%.1f check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["permute_us"], r["combine_us"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_$name.log | head -3
}
moe default FINEGEMM_NOTHING=1
for v in 128 192 256; do if left 300; then moe lean$v FINEGEMM_GROUPED_LEAN=$v; fi; done
if left 330; then moe ybf16 FINEGEMM_MOE_Y=bf16; fi
if left 360; then moe default2 FINEGEMM_NOTHING=1; fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
