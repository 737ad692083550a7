#!/usr/bin/env bash
# Stop 40, the broader paired-lean call (after c1..c2; carry [".snap"] after scripts/pack-prebuilt; ~6 min): the lean kernel in 2-CTA clusters sharing B
# (FINEGEMM_GEMM_LEAN_PAIR=1, b2d8765, written without a GPU). First its test under a timeout (a hang in the cluster
# barriers shows as the timeout: then stop here), then the A/B at issue 3's seven shapes, M = 512 and 4096, every
# height alone and paired, graph replay, each row checked against the CPU reference.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits:GemmConfig.*' >$W/pair_test.log 2>&1
rc=$?; echo "LeanKernelSameBits rc=$rc $(el)"; grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|PAIR" $W/pair_test.log | head -16
if [ $rc -eq 124 ]; then echo "timed out: a hang in the paired kernel?"; cd $OUT && tar czf all.tgz w && rm -rf w; exit 0; fi
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-5d N=%-6d K=%-6d %-50s graph=%8.2f us %6.0f TF/s rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
E=";FINEGEMM_GEMM_LEAN_PAIR=1;FINEGEMM_GEMM_LEAN=256;FINEGEMM_GEMM_LEAN=256,FINEGEMM_GEMM_LEAN_PAIR=1;FINEGEMM_GEMM_LEAN=192,FINEGEMM_GEMM_LEAN_PAIR=1;FINEGEMM_GEMM_LEAN=1,FINEGEMM_GEMM_LEAN_PAIR=1"
for s in 4096:7168 7168:16384 32768:512 24576:1536 7168:2048 2112:7168 576:7168; do
  timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk $s --variants block-fp32-dynamic --envs "$E" >$W/pair_${s/:/_}.jsonl 2>$W/pair_${s/:/_}.err
  echo "-- $s $(el)"; show $W/pair_${s/:/_}.jsonl; tail -1 $W/pair_${s/:/_}.err
done
FINEGEMM_TEST_QUICK=1 timeout 120 compute-sanitizer --tool racecheck $B/tests/test_cuda_linear --gtest_filter='CudaTest.LeanKernelSameBits' >$W/racecheck_pair.log 2>&1
echo "racecheck paired rc=$? $(el)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $W/racecheck_pair.log | head -3
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
