#!/usr/bin/env bash
# stop 20 call 4: the MoE decode PDL chain on/off, alternated (noise), and the dense decode table at the defaults.
cd "$(dirname "$0")"
s0=$(date +%s)
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt
W=$(mktemp -d)
trap 'tar czf $OUT/logs4.tgz -C $W .' EXIT
echo "commit $(cat COMMIT)"
for rep in 1 2; do
  for chain in 0 1; do
    FINEGEMM_MOE_PDL_CHAIN=$chain timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_rep${rep}_chain$chain.jsonl 2>&1
    echo "moe rep=$rep chain=$chain rc=$?"
    grep -o '"layer": "[a-z0-9-]*", "variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*"\|"layer_us_graph": [0-9.]*' $W/moe_rep${rep}_chain$chain.jsonl | paste - - -
  done
done
row() { grep -o '"us_graph": [0-9.]*, "tflops": [0-9.]*, "gbps": [0-9.]*, "rel_err": [-0-9.e]*' "$1" | head -1; }
for shape in 16:24576:1536 64:24576:1536 16:4096:7168 64:4096:7168 32:7168:16384; do
  IFS=: read -r m n k <<<"$shape"
  f=$W/fp8_${shape}_default.txt
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants block-fp32-dynamic >$f 2>&1
  echo "fp8 $shape default $(grep -o -- '-> WN=[0-9]* tiles=[0-9]* split_k=[0-9]*\|-> [0-9x]*' $f | head -1) :: $(row $f)"
done
echo "total $(( $(date +%s) - s0 )) s"
