#!/usr/bin/env bash
# stop 23 call 1: stop 22's unrun changes (caa373e uniform tile loop, 1f933aa decode words) on the GPU: tests, MoE,
# decode, prefill, tile configs, and the prefill profile.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/t GPU_CHECK_DEADLINE=230 TESTS="test_cuda_linear test_cuda_moe test_cuda_fp4 test_cuda_edge" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"; cat $OUT/t/summary.txt
timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes dynamic,fp4 --check-tokens 4 >$W/moe.jsonl 2>$W/moe.err
echo "moe rc=$?"; grep -o '"tokens": [0-9]*\|"recipe": "[a-z0-9_-]*"\|"layer_us": [0-9.]*\|"gate_up_us": [0-9.]*\|"down_us": [0-9.]*\|"check": "[a-z]*"' $W/moe.jsonl | paste -sd' ' | sed 's/"tokens"/\n"tokens"/g'
echo
for shape in 1:7168:16384:mxfp4-group128 1:7168:16384:block-fp32-dynamic 64:7168:16384:block-fp32-dynamic 1:4096:7168:block-fp32-dynamic 4096:7168:16384:block-fp32-dynamic 4096:4096:7168:block-fp32-dynamic 4096:4096:7168:mxfp4-group128; do
  IFS=: read -r m n k var <<<"$shape"
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants $var >$W/lin_$shape.txt 2>&1
  echo "lin $shape :: $(grep -o 'config [^ ]*\|-> [^ ]*' $W/lin_$shape.txt | head -1) $(grep -o '"us_graph": [0-9.]*\|"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/lin_$shape.txt | head -4 | tr '\n' ' ')"
done
for cfg in 128x128 128x192 192x128 128x256; do
  FINEGEMM_GEMM_CONFIG=$cfg FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m 4096 --nk 7168:16384 >$W/cfg_$cfg.txt 2>&1
  echo "cfg $cfg :: $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/cfg_$cfg.txt | head -3 | tr '\n' ' ')"
done
echo "bench: $(( $(date +%s) - s0 )) s"
OUT=$OUT/p PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES="4096:7168:16384" GPU_CHECK_DEADLINE=$(( 560 - $(date +%s) + s0 )) scripts/gpu-check profile 2>&1 | tail -70
cd $OUT && tar czf all.tgz t w p && rm -rf t w p
echo "total $(( $(date +%s) - s0 )) s"
