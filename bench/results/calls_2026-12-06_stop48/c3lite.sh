#!/usr/bin/env bash
# Stop 48's last try with ~250 s of device time left (carry [".snap/prebuilt.txz", ".snap/c3lite.sh"]): the core of
# stop 47's c3.sh only: the DeepSeek-V3 FP4 layer at T = 2048 / 4096 with the consumers' expansion at 192 rows, the
# default (192 rows, batched producers), then 128 rows with the consumers; each layer checked against the CPU reference
# (--check-tokens 1); then the 192-row consumers' crafted-spread test if time is left.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
moe() {  # name, env...
  local name=$1; shift
  env "$@" timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes fp4 --check-tokens 1 >$W/moe_$name.log 2>&1
  echo "-- MoE $name ($*) $(el)"; grep -h '^{' $W/moe_$name.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_$name.log | head -3
}
moe c192 FINEGEMM_FP4_LEAN=192 FINEGEMM_FP4_LEAN_EXPAND=consumers
if left 100; then moe default FINEGEMM_NOTHING=1; fi
if left 140; then moe c128 FINEGEMM_FP4_LEAN=128 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
if left 170; then
  timeout 40 $B/tests/test_cuda_fp4 --gtest_filter='*ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/tests.log 2>&1
  echo "tests rc=$? $(el)"; tail -n 1 $W/tests.log
fi
echo "total $(( $(date +%s) - s0 )) s"
