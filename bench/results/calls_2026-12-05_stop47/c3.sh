#!/usr/bin/env bash
# Stop 47 call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~420 s): the consumers' FP4 expansion at 128 and
# 192 rows: the tests, dense M = 4096 with M-major activation scales (so that the lean FP4 kernel serves it), and the
# DeepSeek-V3 FP4 MoE layer at T = 2048 / 4096 with each height, beside the defaults and the FP8 layer.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-4d N=%-6d K=%-6d %-58s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
timeout 100 $B/tests/test_cuda_fp4 --gtest_filter='*ExactLeanKernelExpansion/cuda:*ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/tests.log 2>&1
echo "tests rc=$? $(el)"; grep -hE "Failure|consumers|^\[  (PASSED|FAILED)|^\[ +OK" $W/tests.log | head -8; tail -n 1 $W/tests.log
moe() {  # name, env...
  local name=$1; shift
  env "$@" timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes ${R:-fp4} --check-tokens 1 >$W/moe_$name.log 2>&1
  echo "-- MoE $name ($*) $(el)"; grep -h '^{' $W/moe_$name.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_$name.log | head -3
}
if left 150; then moe c192 FINEGEMM_FP4_LEAN=192 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
if left 180; then moe c128 FINEGEMM_FP4_LEAN=128 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
if left 210; then moe default FINEGEMM_NOTHING=1; fi
if left 240; then R=dynamic moe fp8 FINEGEMM_NOTHING=1; fi
if left 270; then moe c192b FINEGEMM_FP4_LEAN=192 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
for rep in 1 2; do
  if left 330; then
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_LEAN=1;FINEGEMM_FP4_LEAN=1,FINEGEMM_FP4_LEAN_EXPAND=consumers" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
    timeout 30 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants block-fp32-dynamic >>$W/dense_$rep.jsonl 2>>$W/dense_$rep.err
    echo "-- dense M = 4096, M-major scales, run $rep $(el)"; show $W/dense_$rep.jsonl; tail -n 2 $W/dense_$rep.err
  fi
done
# Added at stop 48: issue 4's T = 16384 bar (last measured at stop 27) on the current defaults.
if left 330; then
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic --check-tokens 1 >$W/moe_16k.log 2>&1
  echo "-- MoE FP8 T = 16384 $(el)"; grep -h '^{' $W/moe_16k.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_16k.log | head -3
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
