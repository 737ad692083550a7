#!/usr/bin/env bash
# Prepared at stop 29 for the next session's first call (copy into .snap after scripts/pack-prebuilt; carry [".snap"]):
# (a) the 42 shapes with stop 29's defaults (one-box B, 192x128 at K <= 512); (b) test_cuda_moe's tests that stop
# 29's call 3 did not reach with one-box B on by default.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
echo "== bench/linear 42 shapes"
timeout 330 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; tail -48 $W/linear42.log
timeout $(( 570 - ($(date +%s) - s0) )) $B/tests/test_cuda_moe --gtest_filter='-CudaMoe.EveryRecipeMatchesReference:CudaMoe.GateUpFusedAndUnfusedEveryRecipe:CudaMoe.GroupedTileHeightsEveryRecipe:CudaMoe.ExpertOutputsBf16AndF32EveryRecipe:CudaMoe.GroupedNMajorOrderEveryRecipe' >$W/t_moe.txt 2>&1
echo "test_cuda_moe (the rest) rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_moe.txt | tr '\n' ' ')"; grep -E '^\[  FAILED' $W/t_moe.txt | head
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
