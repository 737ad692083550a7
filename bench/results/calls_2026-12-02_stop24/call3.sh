#!/usr/bin/env bash
# Stop 24 call 3: the unfused MoE gate_up as the default (static fixed: per-expert scales): MoE tests, then the layer
# fused (FINEGEMM_MOE_UNFUSED=0) vs unfused at T = 256, 1024, 4096 for every recipe; FP4 tests (their dense prefill
# takes the 192x128 clusters now); finegemm check.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
timeout 200 $B/tests/test_cuda_moe >$W/test_moe.txt 2>&1
echo "moe tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_moe.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -E "Failure|rel=" $W/test_moe.txt | head -10
for u in 0 1; do
  FINEGEMM_MOE_UNFUSED=$u timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 256,1024,4096 --recipes dynamic,static,ue8m0,fp4 --check-tokens 4 >$W/moe_$u.jsonl 2>$W/moe_$u.err
  echo "moe unfused=$u rc=$? ($(( $(date +%s) - s0 )) s)"
  grep -o '"layer": "[a-z0-9-]*"\|"recipe": "[a-z0-9-]*"\|"tokens": [0-9]*\|"layer_us": [0-9.]*\|"rel_err": [-0-9.e]*\|"check": "[a-z]*"' $W/moe_$u.jsonl | tr '\n' ' ' | sed 's/"layer":/\n"layer":/g'; echo
  tail -2 $W/moe_$u.err
done
timeout 150 $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1
echo "fp4 tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_fp4.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -E "Failure" -A3 $W/test_fp4.txt | head -10
left=$(( 540 - $(date +%s) + s0 ))
[ $left -gt 30 ] && timeout $left $B/tools/finegemm check --backend cuda >$W/check.txt 2>&1
echo "check rc=$? $(tail -2 $W/check.txt | tr '\n' ' ')"
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
