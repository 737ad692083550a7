#!/usr/bin/env bash
# stop 22 call 1: verify stop 21's unrun code (tests), the FP4 MoE grouped expansion, weights_static decode, the
# decode split for N = 4096 K = 7168.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/t GPU_CHECK_DEADLINE=250 TESTS="test_cuda_fp4 test_cuda_linear test_cuda_moe test_cuda_capture_first" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"; cat $OUT/t/summary.txt
timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 8 >$W/moe.jsonl 2>&1; echo "moe rc=$?"
FINEGEMM_FP4_EXPAND_GROUPED_ROWS=64 timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes fp4 --check-tokens 8 >$W/moe_grouped.jsonl 2>&1; echo "moe grouped rc=$?"
for f in moe moe_grouped; do echo "== $f"; grep -o '"variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*"\|"layer_us[a-z_]*": [0-9.]*\|"gemm_tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/$f.jsonl | tr '\n' ' '; echo; tail -2 $W/$f.jsonl | cut -c1-300; done
echo "moe: $(( $(date +%s) - s0 )) s"
OUT=$OUT/d1 GPU_CHECK_DEADLINE=70 FP4_DECODE_SHAPES="1:24576:1536 1:4096:7168 1:7168:16384 16:24576:1536 64:24576:1536" FP4_DECODE_CONFIGS="fp8:heuristic" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
OUT=$OUT/d2 WEIGHTS_STATIC=1 GPU_CHECK_DEADLINE=70 FP4_DECODE_SHAPES="1:24576:1536 1:4096:7168 1:7168:16384 16:24576:1536 64:24576:1536" FP4_DECODE_CONFIGS="fp8:heuristic" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
OUT=$OUT/d3 GPU_CHECK_DEADLINE=80 FP4_DECODE_SHAPES="1:4096:7168 16:4096:7168 64:4096:7168" FP4_DECODE_CONFIGS="fp8:heuristic fp8:2 fp8:3 fp8:4 fp8:6 fp8:8" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
for d in d1 d2 d3; do echo "== $d"; cat $OUT/$d/summary.txt; done
cd $OUT && tar czf all.tgz t w d1 d2 d3 && rm -rf t w d1 d2 d3
echo "total $(( $(date +%s) - s0 )) s"
