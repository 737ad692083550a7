#!/usr/bin/env bash
# Stop 56, call 3 (carry [".snap/prebuilt.txz", ".snap/c3.sh", ".snap/extra"]; <= ~300 s; call 1's binaries,
# 66ed20f, and bench/micro/poison_memory.cu). Call 1's same-bits failures (test_cuda_moe, seed 8032491131189830397)
# did not come back in call 2 at that seed on a fresh machine: run to run, not the seed's data. Call 1's earlier
# processes had filled trace buffers with 0xFF. (1) GroupedLeanSameBits after filling 90% of free memory with 0xFF,
# at call 1's seed and a fresh one; (2) the crafted-spread FP4 test with call 1's filter and seed and the Hopper
# model's report; the same test under another process's load, with PDL and without; (3) compute-sanitizer initcheck over GroupedLeanSameBits (a read of memory no one wrote), cut at
# the time left.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/gpu.txt
summ() { echo "   $(grep -h 'test data seed' $1 | head -1 | cut -c1-40) failures $(grep -c Failure $1); $(grep -h 'FINEGEMM_GROUPED_LEAN=' $1 | sed 's/.* y=/y=/' | sort | uniq -c | tr '\n' ';' | cut -c1-300)"; }
extra/micro_poison_memory 0xFF 0.9
FINEGEMM_TEST_SEED=8032491131189830397 timeout 60 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/poisoned.txt 2>&1
echo "-- after 0xFF: GroupedLeanSameBits rc=$? $(el)"; summ $W/poisoned.txt
# Timing: the same test while another process loads the GPU (time-sliced), with PDL as by default and off.
load() { for i in 1 2 3 4 5 6; do timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 1 >/dev/null 2>&1; done; }
for pdl in "" 0; do
  load & LP=$!
  sleep 3
  FINEGEMM_PDL=$pdl FINEGEMM_TEST_SEED=8032491131189830397 timeout 90 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/loaded_pdl${pdl:-on}.txt 2>&1
  echo "-- under load, FINEGEMM_PDL='$pdl': GroupedLeanSameBits rc=$? $(el)"; summ $W/loaded_pdl${pdl:-on}.txt
  kill $LP 2>/dev/null; pkill -f bench_cuda_moe; wait 2>/dev/null
done
FINEGEMM_HOPPER_MODEL_REPORT=1 FINEGEMM_TEST_SEED=18343406184352838198 timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*Lean*:Fp4Scan*:*Grouped*:*CraftedSpread*' >$W/crafted_report.txt 2>&1
echo "-- crafted spreads (call 1's filter and seed), model report rc=$? $(el)"; grep -E "hopper model: (GPU rel 1\.1|FP32)|Failure" $W/crafted_report.txt | sort | uniq -c | head -12
extra/micro_poison_memory 0xFF 0.9
FINEGEMM_TEST_SEED=8032491131189830397 timeout 150 compute-sanitizer --tool initcheck --print-limit 20 $B/tests/test_cuda_moe --gtest_filter=CudaMoe.GroupedLeanSameBits >$W/initcheck.txt 2>&1
echo "-- initcheck rc=$? $(el)"; grep -E "Uninitialized|at 0x|in .*kernel|ERROR SUMMARY|by thread" $W/initcheck.txt | head -30; summ $W/initcheck.txt
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
