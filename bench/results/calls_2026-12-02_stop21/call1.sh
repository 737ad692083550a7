#!/usr/bin/env bash
# stop 21 call 1: verify 53d7b80 (pdl_weights_ready), PDL on/off for E4M3 decode with E4M3 and BF16 inputs, ncu profile
# of the E4M3 decode kernel at M = 1.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
s0=$(date +%s)
OUT=$OUT/t GPU_CHECK_DEADLINE=200 TESTS="test_cuda_linear test_cuda_capture_first test_cuda_fp4" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"
for inp in e4m3 bf16; do
  OUT=$OUT/d$inp GPU_CHECK_DEADLINE=120 DECODE_INPUT=$inp FP4_DECODE_SHAPES="1:24576:1536 1:4096:7168 1:7168:16384 16:7168:16384" \
    FP4_DECODE_CONFIGS="fp8:heuristic fp8n:heuristic fp8:heuristic fp8n:heuristic" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
  echo "decode $inp: $(( $(date +%s) - s0 )) s"
done
OUT=$OUT/p GPU_CHECK_DEADLINE=200 PROFILE_SHAPES="1:7168:16384 1:4096:7168" PROFILE_KERNEL=sm90_fp4_decode scripts/gpu-check profile >$OUT/p_stdout.txt 2>&1
for d in t de4m3 dbf16 p; do echo "== $d"; cat $OUT/$d/summary.txt; done
grep -E "Duration|Throughput|dram__bytes|hit_rate|lts__t_sectors|Issue Slot|Warp Cycles|Registers|Achieved Occ" $OUT/p_stdout.txt | head -60
cat $OUT/p/*_smsp.txt 2>/dev/null | head -30
cd $OUT && tar czf all.tgz t de4m3 dbf16 p p_stdout.txt && rm -rf t de4m3 dbf16 p
echo "total $(( $(date +%s) - s0 )) s"
