#!/usr/bin/env bash
# stop 22 call 3: the consumer-descriptor change (d8f60e3): tests, then old (0a08a2b) vs new bench_cuda_linear at the
# prefill shapes interleaved, and the decode split rule.
cd "$(dirname "$0")"
mkdir -p .prebuilt .old && tar xJf prebuilt.txz -C .prebuilt && tar xJf prebuilt_old.txz -C .old
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/t GPU_CHECK_DEADLINE=200 TESTS="test_cuda_linear test_cuda_moe test_cuda_fp4" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"; cat $OUT/t/summary.txt
for shape in 4096:7168:16384 4096:4096:7168 4096:24576:1536 4096:2112:7168 4096:7168:2048 512:7168:16384 128:7168:16384; do
  IFS=: read -r m n k <<<"$shape"
  for rep in 1 2; do for v in old new; do
    bin=.old/bench/bench_cuda_linear; [ $v = new ] && bin=$B/bench/bench_cuda_linear
    FINEGEMM_PRINT_CONFIG=1 timeout 40 $bin --m $m --nk $n:$k --variants block-fp32-dynamic >$W/ab_${v}_${rep}_$shape.txt 2>&1
    echo "ab $v rep$rep M=$m N=$n K=$k $(grep -o 'config [^ ]*\|-> [^ ]*' $W/ab_${v}_${rep}_$shape.txt | head -1) :: $(grep -o '"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/ab_${v}_${rep}_$shape.txt | head -3 | tr '\n' ' ')"
  done; done
done
echo "ab: $(( $(date +%s) - s0 )) s"
OUT=$OUT/d GPU_CHECK_DEADLINE=60 FP4_DECODE_SHAPES="1:4096:7168 64:4096:7168 64:2112:7168 1:7168:2048 64:7168:16384" FP4_DECODE_CONFIGS="fp8:heuristic" scripts/gpu-check bench-fp4-decode >/dev/null 2>&1
cat $OUT/d/summary.txt
cd $OUT && tar czf all.tgz t w d && rm -rf t w d
echo "total $(( $(date +%s) - s0 )) s"
