#!/usr/bin/env bash
# Stop 49 call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"] after scripts/pack-prebuilt; <= ~480 s): first the lean
# kernel's stream-K tail (FINEGEMM_GEMM_LEAN_STREAMK=1, written at stop 49 without a GPU): its test against the CPU
# reference, then the dense FP8 shapes at M = 4096 / 2048 / 512 with and without it, twice, in one process each
# (graph replay); then stop 47's c3 core (the FP4 MoE layer's expansion modes at T = 2048 / 4096, each checked),
# the dense FP4 lean+consumers A/B, and issue 4's FP8 layer at T = 16384, as time allows.
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
        r = json.loads(l); print("  %-18s M=%-4d N=%-6d K=%-6d %-34s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='*LeanStreamKTail*:GemmConfig.LeanPairAndFp4ExpandSwitches' >$W/sk_tests.log 2>&1
echo "stream-K tests rc=$? $(el)"; grep -hE "Failure|^\[  (PASSED|FAILED)|^\[ +OK" $W/sk_tests.log | head -8; grep -hA4 "Failure" $W/sk_tests.log | head -20
NK=4096:7168,7168:16384,2112:7168,24576:1536,7168:2048,576:7168,32768:512
for rep in 1 2; do
  for m in 4096 2048 512; do
    if left 300; then
      timeout 60 $B/bench/bench_cuda_linear --m $m --nk $NK --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_STREAMK=1" >$W/sk_${m}_$rep.jsonl 2>$W/sk_${m}_$rep.err
      echo "-- stream-K M = $m run $rep $(el)"; show $W/sk_${m}_$rep.jsonl; tail -n 2 $W/sk_${m}_$rep.err
    fi
  done
done
moe() {  # name, env...
  local name=$1; shift
  env "$@" timeout 50 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 2048,4096 --recipes ${R:-fp4} --check-tokens 1 >$W/moe_$name.log 2>&1
  echo "-- MoE $name ($*) $(el)"; grep -h '^{' $W/moe_$name.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_$name.log | head -3
}
if left 300; then moe c192 FINEGEMM_FP4_LEAN=192 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
if left 340; then moe default FINEGEMM_NOTHING=1; fi
if left 380; then moe c128 FINEGEMM_FP4_LEAN=128 FINEGEMM_FP4_LEAN_EXPAND=consumers; fi
if left 420; then
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128 --envs ";FINEGEMM_FP4_LEAN=1,FINEGEMM_FP4_LEAN_EXPAND=consumers" >$W/dense_fp4.jsonl 2>$W/dense_fp4.err
  echo "-- dense FP4 M = 4096, M-major scales $(el)"; show $W/dense_fp4.jsonl; tail -n 2 $W/dense_fp4.err
fi
if left 440; then
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic --check-tokens 1 >$W/moe_16k.log 2>&1
  echo "-- MoE FP8 T = 16384 $(el)"; grep -h '^{' $W/moe_16k.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
