#!/usr/bin/env bash
# Stop 31 call 3: the 42 shapes (bench/linear.py, graph replay, every row checked against the CPU reference) with the
# switches given in the environment of this call (the candidates for new defaults after call 2), then the GPU test
# binaries' tests that take the changed paths, as time allows.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
env | grep '^FINEGEMM_' | tee $W/env.txt
echo "== bench/linear 42 shapes"
timeout 330 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; tail -46 $W/linear42.log
left=$(( 560 - ($(date +%s) - s0) ))
[ $left -gt 30 ] && timeout $left $B/tests/test_cuda_linear --gtest_filter='CudaTest.*:-CudaTest.DeferredEpilogueSameBits:CudaTest.ThreadReleaseSameBits' >$W/t_lin.txt 2>&1
echo "test_cuda_linear CudaTest.* rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_lin.txt | tr '\n' ' ') $(grep -cE '^\[ +OK ' $W/t_lin.txt) ok"; grep -E '^\[  FAILED' $W/t_lin.txt | head
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
