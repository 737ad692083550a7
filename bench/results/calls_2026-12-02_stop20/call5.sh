#!/usr/bin/env bash
# stop 20 call 5: the decode kernel's L2 prefetch (FINEGEMM_DECODE_L2_PREFETCH) on dense E4M3 / FP4 decode and MoE T = 1.
cd "$(dirname "$0")"
s0=$(date +%s)
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt
W=$(mktemp -d)
trap 'tar czf $OUT/logs5.tgz -C $W .' EXIT
echo "commit $(cat COMMIT)"
row() { grep -o '"us_graph": [0-9.]*, "tflops": [0-9.]*, "gbps": [0-9.]*, "rel_err": [-0-9.e]*' "$1" | head -1; }
for shape in 1:7168:16384 1:4096:7168 1:24576:1536; do
  IFS=: read -r m n k <<<"$shape"
  for d in 0 2 4 8; do
    f=$W/fp8_${shape}_pf$d.txt
    FINEGEMM_DECODE_L2_PREFETCH=$d timeout 30 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants block-fp32-dynamic >$f 2>&1
    echo "fp8 $shape prefetch=$d :: $(row $f) t=$(( $(date +%s) - s0 ))"
  done
done
for d in 0 4; do
  f=$W/fp4_1:7168:16384_pf$d.txt
  FINEGEMM_DECODE_L2_PREFETCH=$d timeout 30 $B/bench/bench_cuda_linear --m 1 --nk 7168:16384 --variants mxfp4-group128 >$f 2>&1
  echo "fp4 1:7168:16384 prefetch=$d :: $(row $f) t=$(( $(date +%s) - s0 ))"
done
for d in 0 4 2; do
  [ $(( $(date +%s) - s0 )) -gt 95 ] && break
  FINEGEMM_DECODE_L2_PREFETCH=$d timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_pf$d.jsonl 2>&1
  echo "moe prefetch=$d: $(grep -o '"variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*"\|"layer_us_graph": [0-9.]*' $W/moe_pf$d.jsonl | tr '\n' ' ') t=$(( $(date +%s) - s0 ))"
done
FINEGEMM_DECODE_L2_PREFETCH=2 timeout 25 $B/tests/test_cuda_linear --gtest_filter='CudaTest.Fp8WeightsInTheDecodeKernel' >$W/t1.log 2>&1; echo "Fp8WeightsInTheDecodeKernel prefetch=2 rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/t1.log)"
echo "total $(( $(date +%s) - s0 )) s"
