#!/usr/bin/env bash
# Stop 29 call 3: B's tile by one TMA copy (FINEGEMM_GEMM_B_ONE_BOX=1) against two halves. Call 2 found that two
# more TMA requests per stage (L2 prefetches of data already in L2) cost 10-15%: if the copies' count is a price, one
# copy fewer per stage should gain. Its same-bits test, then A/B on the same data (graph replay) at M = 512, 4096 and
# 128, the MoE layer (grouped GEMMs) with and without, its tests with it on. And the K <= 512 heuristic at M = 512.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-40s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % ((r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
run() {  # m n:k envs limit_s
  [ $(( $(date +%s) - s0 )) -lt $4 ] || { echo "skipped M=$1 $2"; return; }
  local f=$W/s_$1_${2/:/_}
  FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m $1 --nk $2 --variants block-fp32-dynamic --envs "$3" >$f.txt 2>$f.err
  echo "== M=$1 $2 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $f.err | head -1)"; show $f.txt
}
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.OneBoxBSameBits' >$W/t_box.txt 2>&1
echo "OneBoxBSameBits rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_box.txt | tr '\n' ' ')"; grep -B2 -A6 Failure $W/t_box.txt | head -30
O=FINEGEMM_GEMM_B_ONE_BOX=1
for nk in 4096:7168 7168:16384 32768:512 24576:1536; do
  X=""; [ $nk = 32768:512 ] && X=";FINEGEMM_GEMM_CONFIG=128x128:1"  # the new K <= 512 pick (192x128 pairs) vs the old
  run 512 $nk ";$O;;$O$X" 100
done
for nk in 4096:7168 7168:16384; do run 4096 $nk ";$O" 140; done
for nk in 32768:512; do run 128 $nk ";$O" 150; done
for o in 0 1; do
  [ $(( $(date +%s) - s0 )) -lt 185 ] || break
  FINEGEMM_GEMM_B_ONE_BOX=$o timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_o$o.jsonl 2>$W/moe_o$o.err
  echo "moe one_box=$o rc=$?"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_o$o.jsonl
done
[ $(( $(date +%s) - s0 )) -lt 215 ] && FINEGEMM_GEMM_B_ONE_BOX=1 timeout $(( 235 - ($(date +%s) - s0) )) $B/tests/test_cuda_moe >$W/t_moe.txt 2>&1
echo "test_cuda_moe (one box) rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_moe.txt | tr '\n' ' ')"; grep -E '^\[  FAILED' $W/t_moe.txt | head
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
