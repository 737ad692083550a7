#!/usr/bin/env bash
# Stop 31 call 2: two GEMM switches, both off by default: one stage release per consumer thread
# (FINEGEMM_GEMM_THREAD_RELEASE=1: the order racecheck follows) and the deferred epilogue (FINEGEMM_GEMM_DEFER_EPILOGUE=1:
# a tile's epilogue behind the next tile's first wgmma group). Same bits (tests), racecheck on the cluster kernels with
# thread release, speed against the default on the shapes under 1.0x cuBLASLt, the MoE layer.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*:CudaTest.ThreadReleaseSameBits:CudaTest.DeferredEpilogueSameBits:CudaTest.SharedBTilesPastM:CudaTest.SharedATilesPastN:CudaTest.HoistedSplitSameBits' >$W/t_lin.txt 2>&1
echo "test_cuda_linear rc=$? $(el) $(grep -E '^\[ +(OK|FAILED) ' $W/t_lin.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -B2 -A6 Failure $W/t_lin.txt | head -40
timeout 120 $B/tests/test_cuda_moe --gtest_filter='CudaMoe.DeferredEpilogueEveryRecipe:CudaMoe.LeanEpilogueAndIdleSkipSameBits' >$W/t_moe.txt 2>&1
echo "test_cuda_moe rc=$? $(el) $(grep -E '^\[ +(OK|FAILED) ' $W/t_moe.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -B2 -A6 Failure $W/t_moe.txt | head -30
for t in SharedBTilesPastM SharedATilesPastN; do
  FINEGEMM_GEMM_THREAD_RELEASE=1 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda_linear \
    --gtest_filter="CudaTest.$t" >$W/race_$t.log 2>&1
  echo "racecheck $t thread release rc=$? $(el) $(grep -E 'SUMMARY' $W/race_$t.log | tail -1)"
done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d env=%-44s graph=%8.2f us %7.1f TFLOP/s rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us_graph"], 2e-6*r["m"]*r["n"]*r["k"]/r["us_graph"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_THREAD_RELEASE; D=FINEGEMM_GEMM_DEFER_EPILOGUE
for s in 4096:4096:7168 512:24576:1536 512:4096:7168 128:32768:512 512:7168:2048 4096:24576:1536 512:7168:16384 128:24576:1536 4096:7168:16384 64:24576:1536; do
  [ $(( $(date +%s) - s0 )) -lt 400 ] || break
  IFS=: read -r m n k <<<"$s"
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$T=1;$D=1;$T=1,$D=1;" >$W/b_${m}_${n}_${k}.txt 2>$W/b_${m}_${n}_${k}.err
  echo "== M=$m N=$n K=$k rc=$? $(el)"; show $W/b_${m}_${n}_${k}.txt
done
for e in "" "$D=1"; do
  [ $(( $(date +%s) - s0 )) -lt 450 ] || break
  env $e timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >$W/moe.jsonl 2>$W/moe.err
  echo "moe ${e:-default} rc=$? $(el)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe.jsonl
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
