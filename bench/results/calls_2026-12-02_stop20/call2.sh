#!/usr/bin/env bash
# stop 20 call 2: where the fixed time of decode goes (dense small shapes, MoE T = 1), PDL at small shapes.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt
W=$(mktemp -d)
trap 'tar czf $OUT/logs2.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
row() { grep -o '"m": [0-9]*, "n": [0-9]*, "k": [0-9]*, "us": [0-9.]*, "us_graph": [0-9.]*, "tflops": [0-9.]*, "gbps": [0-9.]*, "rel_err": [-0-9.e]*' "$1" | head -1; }
cfg() { grep -o -- '-> WN=[0-9]* tiles=[0-9]* split_k=[0-9]*\|-> [0-9x]*' "$1" | head -1; }
# 1. dense decode: PDL off/on, small shapes and tiny K (the fixed cost per call)
for shape in 1:24576:1536 1:4096:7168 64:4096:7168 64:24576:1536 1:4096:128 1:24576:128 1:4096:1024 64:4096:1024 1:7168:16384; do
  IFS=: read -r m n k <<<"$shape"
  for v in "0 " "1 " "0 1" "1 1"; do
    read -r pdl f8 <<<"$v"
    f=$W/lin_${shape}_pdl${pdl}_fp8${f8}.txt
    FINEGEMM_PDL=$pdl FINEGEMM_FP8_DECODE=$f8 FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants block-fp32-dynamic >$f 2>&1
    echo "lin $shape pdl=$pdl fp8dec=${f8:-default} $(cfg $f) :: $(row $f)"
  done
done
# 2. per-kernel durations (ncu, isolated) of the dense decode call and the MoE decode layer
for shape in 1:24576:1536 1:4096:7168 64:4096:7168; do
  IFS=: read -r m n k <<<"$shape"
  timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip 6 --launch-count 4 \
    $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants block-fp32-dynamic >$W/ncu_lin_$shape.csv 2>&1
done
for r in dynamic fp4; do
  timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --launch-skip 30 --launch-count 24 \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1 --recipes $r --check-tokens 1 >$W/ncu_moe_$r.csv 2>&1
done
# 3. MoE T=1 graph time for reference (PDL default on)
for r in dynamic fp4; do
  timeout 100 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 1,16 --recipes $r --check-tokens 1 >$W/moe_$r.jsonl 2>&1
  grep -o "\"layer\".*\"path\": \"[a-z]*\"" $W/moe_$r.jsonl
done
