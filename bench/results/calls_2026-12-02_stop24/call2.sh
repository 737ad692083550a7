#!/usr/bin/env bash
# Stop 24 call 2: the unfused MoE gate_up (FINEGEMM_MOE_UNFUSED=1) against the fused one, its test, the 42-shape
# linear table (block-fp32-dynamic) with 192x128 clusters on by default, the cluster/shared-A tests.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for u in 0 1; do
  FINEGEMM_MOE_UNFUSED=$u timeout 80 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 4096 --recipes dynamic,static --check-tokens 4 >$W/moe_$u.jsonl 2>$W/moe_$u.err
  echo "moe unfused=$u rc=$? ($(( $(date +%s) - s0 )) s)"
  grep -o '"layer": "[a-z0-9-]*"\|"recipe": "[a-z0-9-]*"\|"layer_us": [0-9.]*\|"gate_up_us": [0-9.]*\|"down_us": [0-9.]*\|"rel_err": [-0-9.e]*\|"check": "[a-z]*"' $W/moe_$u.jsonl | tr '\n' ' ' | sed 's/"layer":/\n"layer":/g'; echo
  tail -3 $W/moe_$u.err
done
timeout 120 $B/tests/test_cuda_moe --gtest_filter='*Unfused*' >$W/test_moe.txt 2>&1
echo "moe test rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_moe.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -E "Failure|rel=" $W/test_moe.txt | head -10
timeout 240 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic \
    --budget-s 225 --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -60 $W/bench_linear.txt; tail -5 $W/bench_linear.err
left=$(( 560 - $(date +%s) + s0 ))
[ $left -gt 20 ] && timeout $left $B/tests/test_cuda_linear --gtest_filter='*SharedA*:GemmConfig*:*DoubleAcc*' >$W/test_lin.txt 2>&1
echo "linear tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_lin.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -E "Failure" -A3 $W/test_lin.txt | head -10
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
