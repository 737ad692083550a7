#!/usr/bin/env bash
# Stop 45, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh"]; <= ~420 s, every section guarded by the elapsed time;
# run as C3_COMMIT=<commit> bash .snap/c3.sh).
# (1) Tests: the switch test (the scale warp's new shape rule), test_cuda_fp4 on CUDA whole (two preparer warps now
#     take alternate stages: FINEGEMM_FP4_DECODE_PREPARERS=2), LeanKernelSameBits quick (the scale warp by default at
#     short K).
# (2) Dense decode A/B, one process per shape set: FP4 with one and two preparers beside FP8 (issue 5's 1.6x bar),
#     M = 1, 16, 64 at N = 7168 K = 16384, N = 4096 K = 7168, N = 24576 K = 1536.
# (3) M = 4096 seven shapes with the new scale-warp default (graph replay) against FINEGEMM_GEMM_LEAN_SFB_WARP=0.
# (4) DeepSeek-V3 layer FP4 and FP8 at T = 1, 16 (MoE decode, issue 5) and 4096.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='*/cuda' >$W/fp4_tests.log 2>&1 &
timeout 60 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*' >$W/lin_switch.log 2>&1 &
FINEGEMM_TEST_QUICK=1 timeout 120 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits:CudaTest.LeanScaleWarpManyTiles' >$W/lin_quick.log 2>&1 &
wait
echo "tests $(el)"
for f in fp4_tests lin_switch lin_quick; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is" $W/$f.log | head -8; tail -n 1 $W/$f.log; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-34s graph=%8.2f us ev=%8.2f %7.0f GB/s(ev) rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r.get("gbps", 0) or 0, r["rel_err"]))
' $1; }
for nk in 7168:16384 4096:7168 24576:1536; do
  if left 260; then
    timeout 60 $B/bench/bench_cuda_linear --m 1,16,64 --nk $nk --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_DECODE_PREPARERS=2" >$W/dec_$nk.jsonl 2>$W/dec_$nk.err
    echo "-- decode $nk $(el)"; show $W/dec_$nk.jsonl; tail -n 1 $W/dec_$nk.err
  fi
done
if left 300; then
  timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 2112:7168,24576:1536,32768:512,7168:2048 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_SFB_WARP=0" >$W/m4096.jsonl 2>$W/m4096.err
  echo "-- M = 4096, the scale warp by default at K <= 2048 $(el)"; show $W/m4096.jsonl
fi
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us graph=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r.get("layer_us_graph")))
    else: print(l.rstrip()[:200])'; }
if left 360; then
  timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes fp4,dynamic --check-tokens 1 >$W/moe.log 2>&1
  echo "-- DeepSeek-V3 FP4 and FP8, T = 1, 16, 4096 $(el)"; showmoe $W/moe.log
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
