#!/usr/bin/env bash
# stop 23 call 3: double accumulators on by default for 128x128 (heuristic 1.05): tests, the bar shapes, runs of 8,
# the no-promotion ceiling, the MoE layer, and a profile of the new path.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/t GPU_CHECK_DEADLINE=170 TESTS="test_cuda_linear test_cuda_moe" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"; cat $OUT/t/summary.txt
run() {  # label shape variant env...
  local label=$1 shape=$2 var=$3; shift 3
  IFS=: read -r m n k <<<"$shape"
  env "$@" FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants $var >$W/ab_${label}_$shape.txt 2>&1
  echo "ab $label $var M=$m N=$n K=$k $(grep -o -- '-> [^ ]*' $W/ab_${label}_$shape.txt | head -1) :: $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/ab_${label}_$shape.txt | head -3 | tr '\n' ' ')"
}
for shape in 4096:7168:16384 4096:4096:7168 512:7168:16384; do run default $shape block-fp32-dynamic X=1; done
for shape in 4096:7168:16384 4096:4096:7168; do run c128_run8 $shape block-fp32-dynamic FINEGEMM_GEMM_CONFIG=128x128 FINEGEMM_GEMM_DOUBLE_RUN=8; done
run nopromote_192 4096:7168:16384 channel-token FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=192x128
run nopromote_128 4096:7168:16384 channel-token FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=128x128
echo "ab: $(( $(date +%s) - s0 )) s"
for r in 4 8; do
  FINEGEMM_GEMM_DOUBLE_RUN=$r timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_$r.jsonl 2>$W/moe_$r.err
  echo "moe run=$r rc=$? $(grep -o '"layer_us": [0-9.]*\|"gate_up_us": [0-9.]*\|"down_us": [0-9.]*\|"check": "[a-z]*"' $W/moe_$r.jsonl | tr '\n' ' ')"
done
echo "moe: $(( $(date +%s) - s0 )) s"
left=$(( 420 - $(date +%s) + s0 ))
if [ $left -gt 80 ]; then
  OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:4096:7168" GPU_CHECK_DEADLINE=$left scripts/gpu-check profile 2>&1 | grep -E "stalled|Duration|Throughput|Warp Cycles" | head -30
fi
cd $OUT && tar czf all.tgz t w $( [ -d p ] && echo p ) && rm -rf t w p
echo "total $(( $(date +%s) - s0 )) s"
