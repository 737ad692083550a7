#!/usr/bin/env bash
# Stop 41, call 4 (carry [".snap"] after scripts/pack-prebuilt; ~6 min): the FP4 decode kernel on permuted activations
# (FINEGEMM_FP4_DECODE_PERM=1, written without a GPU): tests first, then the A/B that decides issue 5's decode bar
# (FP4 >= 1.6x faster than FP8 weights at M <= 64).
# (1) test_cuda_fp4: ExactPermutedDecode (launch counter: every recipe it serves takes it, the others do not), the
#     crafted-spread tests whose check_exact_every_config now runs it (one wide row per tile, mixed blocks along K, K
#     tail: falls back), and the random-data test (perm variant at M = 1 and 16).
#     The crafted FP4 MoE test runs it on the decode path (both expert GEMMs, a launch count per variant, split 2 with
#     and without the in-kernel finish); the quantizers' permuted stores bit for bit (dense and the MoE permute).
# (2) bench_cuda_linear --bf16-input (linear() quantizes: the permuted order needs our own quantization, so both sides
#     time it), graph replay, M = 1 / 16 / 64 over issue 3's seven shapes: mxfp4-group128 default vs permuted, and the
#     FP8 weights (block-fp32-dynamic) beside.
# (3) The DeepSeek-V3 MoE layer at T = 1 and 16 (decode path): FP4 experts default and permuted, FP8 experts beside
#     (issue 5's MoE decode bar: FP4 1.6x faster than FP8).
# Then c5.sh: prefill sizes on its 128-token tiles and the sanitizers.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 200 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactPermutedDecode/cuda:Backends/Fp4Linear.ExactOneWideRowInATile/cuda:Backends/Fp4Linear.ExactMixedBlocksAlongK/cuda:Backends/Fp4Linear.ExactRandomSpreadsWithKTail/cuda' >$W/perm_tests.log 2>&1 &
timeout 200 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Random.LinearMatchesReference/cuda:Backends/Fp4Moe.*/cuda' >$W/random_tests.log 2>&1 &
timeout 200 $B/tests/test_cuda_moe_routing --gtest_filter='CudaMoeRouting.PermuteQuantizeBitExact' >$W/quant_tests.log 2>&1 &
timeout 200 $B/tests/test_cuda_linear --gtest_filter='CudaTest.QuantizeActivationsBitExact' >>$W/quant_tests.log 2>&1 &
wait
echo "tests $(el)"
for f in perm_tests random_tests quant_tests; do echo "-- $f"; grep -hE "^\[  (PASSED|FAILED)|Failure|actual|Which is|Expected|took it|did not" $W/$f.log | head -12; done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-20s M=%-3d N=%-6d K=%-6d %-32s graph=%8.2f us %6.2f TB/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, (r.get("gbps") or 0) / 1000, r["rel_err"]))
' $1; }
for s in 7168:16384 4096:7168 2112:7168 576:7168 24576:1536 32768:512 7168:2048; do
  timeout 40 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk $s --variants mxfp4-group128 --envs ";FINEGEMM_FP4_DECODE_PERM=1" >$W/perm_${s/:/_}.jsonl 2>$W/perm_${s/:/_}.err
  timeout 25 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk $s --variants block-fp32-dynamic >$W/fp8_${s/:/_}.jsonl 2>$W/fp8_${s/:/_}.err
  echo "-- $s $(el)"; show $W/perm_${s/:/_}.jsonl; show $W/fp8_${s/:/_}.jsonl; tail -n 1 $W/perm_${s/:/_}.err
done
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"]))
    else: print(l.rstrip()[:200])'; }
for e in "FINEGEMM_FP4_DECODE_PERM=0" "FINEGEMM_FP4_DECODE_PERM=1"; do
  env $e timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes fp4 --check-tokens 1 >$W/moe_${e##*=}.log 2>&1
  echo "-- DeepSeek-V3 FP4 experts $e $(el)"; showmoe $W/moe_${e##*=}.log
done
timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes dynamic --check-tokens 1 >$W/moe_fp8.log 2>&1
echo "-- DeepSeek-V3 FP8 experts $(el)"; showmoe $W/moe_fp8.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
