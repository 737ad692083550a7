#!/usr/bin/env bash
# Stop 42, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"] after scripts/pack-prebuilt; <= 590 s, every section
# guarded by the elapsed time): the most decisive parts of stop 41's c4/c5 and stop 40's c3 in one start, since starts
# are scarce.
# (1) Tests of the permuted FP4 decode kernel (FINEGEMM_FP4_DECODE_PERM=1) and its quantizers' permuted stores.
# (2) Dense decode, M = 1/16/64, issue 3's seven shapes, graph replay:
#     FP4 (mxfp4-group128, --bf16-input: linear() quantizes, needed for the permuted order) default vs permuted, FP8
#     beside with the same input (issue 5's decode bar: FP4 1.6x faster than FP8);
#     FP8 (block-fp32-dynamic, pre-quantized input as in issue 3's record) default vs the in-kernel split-K finish
#     (FINEGEMM_DECODE_SPLIT_FINISH=1; issue 3's decode bar 3.0 TB/s).
# (3) DeepSeek-V3 MoE layer T = 1, 16: FP4 default / permuted, FP8 (issue 5's MoE decode bar).
# (4) The lean kernel's 2-CTA pairs (FINEGEMM_GEMM_LEAN_PAIR=1 sharing B, stop 40; =a sharing A, stop 42): their
#     same-bits test (quick: every height, tails, a second tile past M / N, the paired launches counted) with (1), then
#     M = 4096 at N = 4096 K = 7168 (bar 1400 TFLOP/s), N = 32768 K = 512 (0.96x cuBLASLt), N = 24576 K = 1536.
# (5) If time is left: the other four decode shapes, DeepSeek-V3 FP4 T = 4096 on the permuted decode path's 128-token
#     tiles vs the FP4 default.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
# C1_BUDGET (default 590 s): the whole call's time; every section starts only with its share left.
C1=${C1_BUDGET:-590}
left() { [ $(( $(date +%s) - s0 )) -lt $(( $1 - 590 + C1 )) ]; }
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactPermutedDecode/cuda:Backends/Fp4Linear.ExactOneWideRowInATile/cuda:Backends/Fp4Linear.ExactMixedBlocksAlongK/cuda:Backends/Fp4Linear.ExactRandomSpreadsWithKTail/cuda' >$W/perm_tests.log 2>&1 &
FINEGEMM_TEST_QUICK=1 timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Random.LinearMatchesReference/cuda:Backends/Fp4Moe.*/cuda' >$W/random_tests.log 2>&1 &
(timeout 100 $B/tests/test_cuda_moe_routing --gtest_filter='CudaMoeRouting.PermuteQuantizeBitExact'; timeout 100 $B/tests/test_cuda_linear --gtest_filter='CudaTest.QuantizeActivationsBitExact') >$W/quant_tests.log 2>&1 &
FINEGEMM_TEST_QUICK=1 timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits:GemmConfig.*' >$W/pair_tests.log 2>&1 &
wait
echo "tests $(el)"
for f in perm_tests random_tests quant_tests pair_tests; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is|took it|did not|Timeout|timed out" $W/$f.log | head -12; tail -n 2 $W/$f.log; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-20s M=%-3d N=%-6d K=%-6d %-32s graph=%8.2f us %6.2f TB/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, (r.get("gbps") or 0) / 1000, r["rel_err"]))
' $1; }
showtf() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-28s graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
decode() {
  for s in "$@"; do
  left 430 || break
  t=${s/:/_}
  timeout 40 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk $s --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_PERM=1" >$W/perm_$t.jsonl 2>$W/perm_$t.err
  timeout 25 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk $s --variants block-fp32-dynamic >$W/fp8b_$t.jsonl 2>$W/fp8b_$t.err
  timeout 30 $B/bench/bench_cuda_linear --m 1,16,64 --nk $s --variants block-fp32-dynamic --envs ";FINEGEMM_DECODE_SPLIT_FINISH=1" >$W/fin_$t.jsonl 2>$W/fin_$t.err
  echo "-- $s $(el)"; show $W/perm_$t.jsonl; show $W/fp8b_$t.jsonl; show $W/fin_$t.jsonl; tail -qn 1 $W/perm_$t.err $W/fin_$t.err
  done
}
decode 7168:16384 4096:7168 24576:1536
if left 420; then
  timeout 80 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,32768:512,24576:1536 --variants block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_PAIR=1;FINEGEMM_GEMM_LEAN_PAIR=a" >$W/pair.jsonl 2>$W/pair.err
  echo "-- lean pairs at M = 4096 (default, sharing B, sharing A) $(el)"; showtf $W/pair.jsonl; tail -n 1 $W/pair.err
fi
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"]))
    else: print(l.rstrip()[:200])'; }
for e in "FINEGEMM_FP4_DECODE_PERM=0" "FINEGEMM_FP4_DECODE_PERM=1" "FP8"; do
  left 500 || break
  if [ $e = FP8 ]; then timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic --check-tokens 1 >$W/moe_FP8.log 2>&1
  else env $e timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes fp4 --check-tokens 1 >$W/moe_${e##*=}.log 2>&1; fi
  echo "-- DeepSeek-V3 T = 1, 16: $e $(el)"; showmoe $W/moe_${e##*=}.log
done
decode 2112:7168 576:7168 32768:512 7168:2048
for e in "FINEGEMM_MOE_DECODE=1 FINEGEMM_FP4_DECODE_PERM=1" "FINEGEMM_FP4_DECODE_PERM=0"; do
  left 530 || break
  env $e timeout 45 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 1 >$W/moep_${e##*=}.log 2>&1
  echo "-- DeepSeek-V3 FP4 T = 4096: $e $(el)"; showmoe $W/moep_${e##*=}.log
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
