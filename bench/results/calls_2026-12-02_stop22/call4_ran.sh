#!/usr/bin/env bash
# stop 22 call 4 (552dbbe): test_cuda_moe with the noise-aware decode-path bar, the DeepSeek-V3 MoE layer at T = 4096,
# bench/linear at M = 4096 (block-fp32-dynamic, against cuBLASLt).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
timeout 130 $B/tests/test_cuda_moe >$W/test_cuda_moe.txt 2>&1
echo "test_cuda_moe rc=$? $(grep -E 'PASSED|FAILED|bar=|seed' $W/test_cuda_moe.txt | head -8 | tr '\n' ' ')"
timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 4 >$W/moe.jsonl 2>&1
OUT=$OUT/b LINEAR_MS=4096 LINEAR_VARIANTS=block-fp32-dynamic LINEAR_BUDGET=90 GPU_CHECK_DEADLINE=110 scripts/gpu-check bench >/dev/null 2>&1
echo "bench: $(( $(date +%s) - s0 )) s"; tail -60 $OUT/b/bench_linear.txt 2>/dev/null || ls $OUT/b
grep -o '"variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*"\|"layer_us": [0-9.]*\|"gemm_tflops": [0-9.]*' $W/moe.jsonl | tr '\n' ' '; echo
cd $OUT && tar czf all.tgz w b && rm -rf w b
echo "total $(( $(date +%s) - s0 )) s"
