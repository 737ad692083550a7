#!/usr/bin/env bash
# stop 20 call 3: tests and sanitizers with the MoE decode PDL chain and dense E4M3 decode PDL on, then benches.
cd "$(dirname "$0")"
s0=$(date +%s)
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt
W=$(mktemp -d)
trap 'tar czf $OUT/logs3.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee $W/gpu.txt
echo "commit $(cat COMMIT)"
# 1. Correctness, everything at once (test_cuda_linear in three shards).
for i in 0 1 2; do (GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i timeout 300 $B/tests/test_cuda_linear >$W/test_cuda_linear_$i.log 2>&1; echo $? >$W/test_cuda_linear_$i.rc) & done
for t in test_cuda_fp4 test_cuda_moe test_cuda_edge test_cuda_moe_routing test_cuda_capture_first; do
  (timeout 300 $B/tests/$t >$W/$t.log 2>&1; echo $? >$W/$t.rc) &
done
(for tool in memcheck racecheck; do
   timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda_moe \
     --gtest_filter='CudaMoe.SkewedRoutingEmptyExpertsAndOneExpertTakesAll:CudaMoe.DecodePathOneExpertInChunks' >$W/san_moe_$tool.log 2>&1
   echo $? >$W/san_moe_$tool.rc
 done) &
(timeout 120 $B/tools/finegemm run --backend cuda >$W/run_cuda.txt 2>&1; echo $? >$W/run_cuda.rc) &
wait
for f in $W/*.rc; do n=$(basename $f .rc); echo "$n rc=$(cat $f) $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' $W/$n.log 2>/dev/null | tr '\n' ' ')"; done
grep -h -E 'FAILED|Failure|test data seed' $W/*.log | head -20
tail -20 $W/run_cuda.txt
echo "correctness phase: $(( $(date +%s) - s0 )) s"
# 2. MoE layer, chain on / off (graph replay), every timed row checked against the CPU reference first.
for chain in 1 0; do
  FINEGEMM_MOE_PDL_CHAIN=$chain timeout 120 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 1,16 --recipes dynamic,fp4 --check-tokens 1 >$W/moe_chain$chain.jsonl 2>$W/moe_chain$chain.err
  echo "moe chain=$chain rc=$?"
  grep -o '"layer": "[a-z0-9-]*", "variant": "[a-z0-9-]*", "T": [0-9]*\|"check": "[a-z]*", "rel_err": [-0-9.e]*\|"layer_us_graph": [0-9.]*\|"weight_tbps": [0-9.]*' $W/moe_chain$chain.jsonl | paste - - - - 
  echo "t=$(( $(date +%s) - s0 )) s"
done
# 3. Dense decode: FP4 weights with PDL off / on, E4M3 at the new default (PDL on).
row() { grep -o '"us_graph": [0-9.]*, "tflops": [0-9.]*, "gbps": [0-9.]*, "rel_err": [-0-9.e]*' "$1" | head -1; }
for shape in 1:24576:1536 1:4096:7168 1:7168:16384 64:7168:16384 16:7168:16384; do
  IFS=: read -r m n k <<<"$shape"
  [ $(( $(date +%s) - s0 )) -gt 540 ] && break
  for pdl in 0 1; do
    f=$W/fp4_${shape}_pdl$pdl.txt
    FINEGEMM_PDL=$pdl timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants mxfp4-group128 >$f 2>&1
    echo "fp4 $shape pdl=$pdl :: $(row $f)"
  done
  f=$W/fp8_${shape}_default.txt
  timeout 40 $B/bench/bench_cuda_linear --m $m --nk $n:$k --variants block-fp32-dynamic >$f 2>&1
  echo "fp8 $shape default :: $(row $f)"
done
echo "total $(( $(date +%s) - s0 )) s"
