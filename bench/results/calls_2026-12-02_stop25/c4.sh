cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
moe() {  # name envs layers tokens recipes
  env $2 timeout 90 $B/bench/bench_cuda_moe --layers $3 --tokens $4 --recipes $5 --check-tokens 4 >$W/moe_$1.jsonl 2>$W/moe_$1.err
  echo "moe $1 [$2] rc=$? ($(( $(date +%s) - s0 )) s)"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-6d %-8s layer_us=%9.1f graph=%8.1f gemm_tflops=%6.1f w_tbps=%5.2f path=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["layer_us"], r["layer_us_graph"], r["gemm_tflops"], r["weight_tbps"], r.get("path")))
' $W/moe_$1.jsonl
}
timeout 150 $B/tests/test_cuda_moe --gtest_filter='*GroupedTileHeights*:*LeanEpilogueAndIdleSkip*:*GateUpFusedAndUnfused*' >$W/test_moe.txt 2>&1
echo "moe tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_moe.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -E "Failure" -A3 $W/test_moe.txt | head -10
timeout 240 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic \
    --budget-s 225 --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -45 $W/bench_linear.txt; tail -3 $W/bench_linear.err
moe def '' deepseek-v3,qwen3-30b-a3b 1,64,1024,2048,4096,16384 dynamic
moe bm128 FINEGEMM_GROUPED_BLOCK_M=128 deepseek-v3,qwen3-30b-a3b 16384 dynamic
moe bm192 FINEGEMM_GROUPED_BLOCK_M=192 deepseek-v3 1024 dynamic
moe fp4 '' deepseek-v3 1,2048,4096 fp4
moe fp4x64 FINEGEMM_FP4_EXPAND_GROUPED_ROWS=64 deepseek-v3 2048 fp4
left=$(( 570 - $(date +%s) + s0 ))
[ $left -gt 20 ] && timeout $left $B/tests/test_cuda_fp4 >$W/test_fp4.txt 2>&1
echo "fp4 tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_fp4.txt | tr '\n' ' ') $(grep -c '^\[       OK' $W/test_fp4.txt) ok"; grep -E "Failure" -A3 $W/test_fp4.txt | head -10
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
