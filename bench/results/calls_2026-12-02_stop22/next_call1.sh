#!/usr/bin/env bash
# Next session's first call: stop 22's unrun changes (caa373e uniform tile loop, 1f933aa decode words) against
# 552dbbe's binaries (pack them beside as prebuilt_old.txz: /work/calls/s22/prebuilt_552dbbe.txz).
cd "$(dirname "$0")"
mkdir -p .prebuilt .old && tar xJf prebuilt.txz -C .prebuilt && tar xJf prebuilt_old.txz -C .old
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
OUT=$OUT/t GPU_CHECK_DEADLINE=230 TESTS="test_cuda_linear test_cuda_moe test_cuda_fp4 test_cuda_edge" scripts/gpu-check test >/dev/null 2>&1
echo "tests: $(( $(date +%s) - s0 )) s"; cat $OUT/t/summary.txt
for rep in 1 2; do for v in old new; do
  bin=.old/bench; [ $v = new ] && bin=$B/bench
  timeout 60 $bin/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe_${v}_$rep.jsonl 2>&1
  echo "moe $v rep$rep $(grep -o '"layer_us": [0-9.]*\|"gate_up_us": [0-9.]*\|"down_us": [0-9.]*\|"check": "[a-z]*"' $W/moe_${v}_$rep.jsonl | tr '\n' ' ')"
  for shape in 1:7168:16384:mxfp4-group128 1:7168:16384:block-fp32-dynamic 4096:7168:16384:block-fp32-dynamic; do
    IFS=: read -r m n k var <<<"$shape"
    timeout 40 $bin/bench_cuda_linear --m $m --nk $n:$k --variants $var >$W/lin_${v}_${rep}_$shape.txt 2>&1
    echo "lin $v rep$rep $shape :: $(grep -o '"us_graph": [0-9.]*\|"us": [0-9.]*\|"tflops": [0-9.]*\|"rel_err": [-0-9.e]*' $W/lin_${v}_${rep}_$shape.txt | head -4 | tr '\n' ' ')"
  done
done; done
cd $OUT && tar czf all.tgz t w && rm -rf t w
echo "total $(( $(date +%s) - s0 )) s"
