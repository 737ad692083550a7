#!/usr/bin/env bash
# stop 23 call 2: double accumulators (FINEGEMM_GEMM_DOUBLE_ACC=1) — correctness, then A/B against one set and the
# default 192x128 tiles at the prefill shapes, the MoE layer, and a profile of the new path.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
timeout 150 $B/tests/test_cuda_linear --gtest_filter='*DoubleAcc*:*EveryTileConfig*' >$W/test_double.txt 2>&1
echo "test DoubleAcc+EveryTileConfig rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_double.txt | tr '\n' ' ')"; grep -E "Failure|Expected|Which is|same_bits|rel" $W/test_double.txt | head -20
FINEGEMM_GEMM_DOUBLE_ACC=1 FINEGEMM_GEMM_CONFIG=128x128 timeout 60 $B/tools/finegemm check --backend cuda >$W/check_double.txt 2>&1
echo "check (double, 128x128) rc=$? $(tail -1 $W/check_double.txt)"
echo "tests: $(( $(date +%s) - s0 )) s"
run() {  # label env... -- shape
  local label=$1 shape=$2; shift 2
  IFS=: read -r m n k <<<"$shape"
  env "$@" FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k >$W/ab_${label}_$shape.txt 2>&1
  echo "ab $label M=$m N=$n K=$k $(grep -o -- '-> [^ ]*' $W/ab_${label}_$shape.txt | head -1) :: $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/ab_${label}_$shape.txt | head -3 | tr '\n' ' ')"
}
for shape in 4096:7168:16384 4096:4096:7168 4096:24576:1536 4096:2112:7168 4096:7168:2048 2048:7168:16384 512:7168:16384; do
  run default $shape X=1
  run c128_one $shape FINEGEMM_GEMM_CONFIG=128x128 FINEGEMM_GEMM_DOUBLE_ACC=0
  run c128_two $shape FINEGEMM_GEMM_CONFIG=128x128 FINEGEMM_GEMM_DOUBLE_ACC=1
done
for shape in 4096:7168:16384 4096:4096:7168; do
  run default_r2 $shape X=1
  run c128_two_r2 $shape FINEGEMM_GEMM_CONFIG=128x128 FINEGEMM_GEMM_DOUBLE_ACC=1
  run c128_two_c2 $shape FINEGEMM_GEMM_CONFIG=128x128:1c2 FINEGEMM_GEMM_DOUBLE_ACC=1
done
for shape in 512:7168:16384 128:7168:16384 4096:2112:7168; do
  run c64_one $shape FINEGEMM_GEMM_CONFIG=128x64 FINEGEMM_GEMM_DOUBLE_ACC=0
  run c64_two $shape FINEGEMM_GEMM_CONFIG=128x64 FINEGEMM_GEMM_DOUBLE_ACC=1
done
echo "ab: $(( $(date +%s) - s0 )) s"
for d in 0 1; do
  FINEGEMM_GEMM_DOUBLE_ACC=$d timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_$d.jsonl 2>$W/moe_$d.err
  echo "moe double=$d rc=$? $(grep -o '"layer": "[a-z0-9-]*"\|"layer_us": [0-9.]*\|"gate_up_us": [0-9.]*\|"down_us": [0-9.]*\|"check": "[a-z]*"' $W/moe_$d.jsonl | tr '\n' ' ')"
done
echo "moe: $(( $(date +%s) - s0 )) s"
left=$(( 540 - $(date +%s) + s0 ))
if [ $left -gt 90 ]; then
  FINEGEMM_GEMM_CONFIG=128x128 FINEGEMM_GEMM_DOUBLE_ACC=1 OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:7168:16384" GPU_CHECK_DEADLINE=$left scripts/gpu-check profile 2>&1 | grep -E "stalled|Duration|Throughput|Warp Cycles" | head -30
fi
cd $OUT && tar czf all.tgz w $( [ -d p ] && echo p ) && rm -rf w p
echo "total $(( $(date +%s) - s0 )) s"
