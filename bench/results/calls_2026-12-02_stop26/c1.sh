#!/usr/bin/env bash
# Next session's first call (after scripts/pack-prebuilt; cp this into .snap; carry [".snap"]): stop 25's unmeasured
# clusters. First a smoke run of each new kernel under a short timeout (a deadlock shows as rc=124 there, not as a
# lost call), then their tests, then the dense 2x2 clusters (c4) and the early stage release against the default at
# five M = 4096 shapes and without promotion, decode and M = 128 configs, the grouped pairs sharing A, the n-block-major
# expert order and the BF16 expert outputs and gate_up scratch in the MoE layer, then the linear tests stop 25 did not
# reach.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
run() {  # name m n:k variant envs [timeout]
  FINEGEMM_PRINT_CONFIG=1 timeout ${6:-60} $B/bench/bench_cuda_linear --m $2 --nk $3 --variants $4 --envs "$5" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 $4 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*\|cluster launch.*' $W/$1.err | sort | uniq | tr '\n' '|')"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-48s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/$1.txt
}
moe() {  # name envs layers tokens [timeout]
  env $2 timeout ${5:-90} $B/bench/bench_cuda_moe --layers $3 --tokens $4 --recipes dynamic --check-tokens 4 >$W/moe_$1.jsonl 2>$W/moe_$1.err
  echo "moe $1 [$2] rc=$? ($(( $(date +%s) - s0 )) s)"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_$1.jsonl
}
# Each step after the tests runs only while the call has time left, so that the results are packed before 600 s.
before() { [ $(( $(date +%s) - s0 )) -lt $1 ] || { echo "skipped (past $1 s): $*"; return 1; }; }
V=block-fp32-dynamic
run smoke_c4 1024 1024:1024 $V 'FINEGEMM_GEMM_CONFIG=192x128:1c4;FINEGEMM_GEMM_CONFIG=128x128:1c4' 30
moe smoke_grouped FINEGEMM_GROUPED_CLUSTER=1 qwen3-30b-a3b 2048 30
timeout 170 $B/tests/test_cuda_linear --gtest_filter='*ClustersOfFour*:*EarlyRelease*:*EveryTileConfig*:*SharedATilesPastN*:*WideStoresSameBits*:GemmConfig*' >$W/test_c4.txt 2>&1
echo "c4 tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_c4.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -E "Failure" -A3 $W/test_c4.txt | head -10
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedSharedAPairs*:*GroupedNMajor*:*ExpertOutputsBf16*:*GateUpScratchBf16*' >$W/test_pairs.txt 2>&1
echo "grouped pairs / n-major / bf16 y tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_pairs.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -E "Failure" -A3 $W/test_pairs.txt | head -10
E=';FINEGEMM_GEMM_EARLY_RELEASE=1;FINEGEMM_GEMM_CONFIG=192x128:1c4;FINEGEMM_GEMM_CONFIG=128x128:1c4;FINEGEMM_GEMM_CONFIG=192x128:1c4,FINEGEMM_GEMM_EARLY_RELEASE=1;FINEGEMM_GEMM_CONFIG=192x128:1c2a'
for nk in 7168:16384 4096:7168 24576:1536 2112:7168 7168:2048; do before 470 && run c4_${nk/:/_} 4096 $nk $V "$E"; done
before 470 && run c4_nopromote 4096 7168:16384 channel-token 'FINEGEMM_GEMM_FP32_ACCUM=0;FINEGEMM_GEMM_FP32_ACCUM=0,FINEGEMM_GEMM_CONFIG=192x128:1c4;FINEGEMM_GEMM_FP32_ACCUM=0,FINEGEMM_GEMM_CONFIG=192x128:1c2a'
before 470 && run c4_m2048 2048 7168:16384 $V "$E"
# Decode at M = 1 (issue 3's 3.0 TB/s bar: 12.6 us at N = 24576 K = 1536, 9.8 at N = 4096 K = 7168; stop 25: 13.0, 12.9).
before 470 && run dec24576 1 24576:1536 $V ';FINEGEMM_DECODE_ROWS=128;FINEGEMM_FP4_DECODE_SPLIT=2;FINEGEMM_PDL=0'
before 470 && run dec4096 1 4096:7168 $V ';FINEGEMM_DECODE_ROWS=128;FINEGEMM_FP4_DECODE_SPLIT=2;FINEGEMM_FP4_DECODE_SPLIT=8'
# M = 128 N = 7168 K = 16384 (0.94x cuBLASLt at 52.7 us): other tiles and split counts.
before 470 && run m128 128 7168:16384 $V ';FINEGEMM_GEMM_CONFIG=128x64:1;FINEGEMM_GEMM_CONFIG=128x64:2;FINEGEMM_GEMM_CONFIG=128x128:3;FINEGEMM_GEMM_CONFIG=64x128:2;FINEGEMM_GEMM_CONFIG=64x64:2'
before 470 && moe def '' deepseek-v3,qwen3-30b-a3b 2048,4096,16384
before 470 && moe pairs FINEGEMM_GROUPED_CLUSTER=1 deepseek-v3,qwen3-30b-a3b 2048,4096,16384
before 470 && moe nmajor FINEGEMM_GROUPED_ORDER=n deepseek-v3,qwen3-30b-a3b 4096,16384
before 470 && moe ybf16 FINEGEMM_MOE_Y=bf16 deepseek-v3,qwen3-30b-a3b 2048,4096
before 470 && moe scratch16 FINEGEMM_MOE_SCRATCH=bf16 deepseek-v3,qwen3-30b-a3b 2048,4096
before 470 && moe both16 'FINEGEMM_MOE_Y=bf16 FINEGEMM_MOE_SCRATCH=bf16' deepseek-v3,qwen3-30b-a3b 4096
left=$(( 560 - $(date +%s) + s0 ))
[ $left -gt 30 ] && timeout $left $B/tests/test_cuda_linear --gtest_filter='AllRecipes*:*Fp32Accum*:*PreQuantized*' >$W/test_lin.txt 2>&1
echo "linear tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_lin.txt | tr '\n' ' ') $(grep -c '^\[       OK' $W/test_lin.txt) ok"; grep -E "Failure" -A3 $W/test_lin.txt | head -10
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
