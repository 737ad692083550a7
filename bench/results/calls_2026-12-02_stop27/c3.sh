#!/usr/bin/env bash
# Stop 27 call 3: the bulk A-scale copies now on by default and M-major scales of a pre-quantized x accepted: their
# tests, memcheck and initcheck of the bulk path (the quantizer now fills the padding rows), then the 42-shape table
# with both sides given M-major activation scales (bench/linear.py's new default) and CUDA-graph replay.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
timeout 200 $B/tests/test_cuda_linear --gtest_filter='CudaTest.MMajorActivationScalesSameBits:CudaTest.BulkScaleCopiesSameBits:CudaTest.HoistedSplitSameBits:CudaTest.QuantizeActivationsBitExact:CudaTest.PreQuantized*:CudaTest.SharedBTilesPastM' >$W/tests.txt 2>&1
echo "tests rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[ +(OK|FAILED) ' $W/tests.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -B2 -A6 Failure $W/tests.txt | head -30
for tool in memcheck initcheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda_linear --gtest_filter='CudaTest.PreQuantizedActivationsAndFp16:CudaTest.SharedBTilesPastM' >$W/san_$tool.log 2>&1
  echo "$tool rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E 'SUMMARY' $W/san_$tool.log | tail -1)"; grep -m3 -A4 "Error\|Uninitialized" $W/san_$tool.log | head -12
done
left=$(( 520 - $(date +%s) + s0 ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic \
    --budget-s $(( left - 15 )) --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -48 $W/bench_linear.txt; tail -3 $W/bench_linear.err
if [ $(( $(date +%s) - s0 )) -lt 430 ]; then
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,4096,16384 --recipes dynamic --check-tokens 4 >$W/moe.jsonl 2>$W/moe.err
  echo "moe rc=$? ($(( $(date +%s) - s0 )) s)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe.jsonl
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
