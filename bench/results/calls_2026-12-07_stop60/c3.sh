#!/usr/bin/env bash
# Stop 60, call 3 (LIMIT=<timeout_s>; did not run at stop 60, fixed for the next: the test names, --bf16-input):
# (0) the small-N wgmma probe and the direct-copy kernel's copies alone; the FP4 decode kernel whose threads copy their own weights
# (FINEGEMM_FP4_DECODE_LDG=1, sm90_fp4_decode_ldg.cuh): (1) its exactness tests and the permuted kernel's, then
# memcheck and racecheck on its quick test; (2) dense decode, graph replay, FP8 against FP4 as it is and with the
# switch, M = 1 / 16 / 32 / 64 on the bars' shapes; (3) MoE decode (DeepSeek-V3 T = 1 / 16, graph replay) FP8 and
# FP4 without and with the switch; (4) the sanitizers; (5) ncu of one launch at M = 1 N = 7168 K = 16384.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w3; mkdir -p $W; LIMIT=${LIMIT:-450}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name --format=csv,noheader
echo "-- small-N wgmma rates (bench/micro/wgmma_small_n.cu)"
timeout 60 $B/bench/micro_wgmma_small_n 2000 2>&1 | tee $W/wgmma_small_n.txt
echo "-- the direct-copy kernel's copies alone (bench/micro/ldg_decode_stream.cu)"
timeout 60 $B/bench/micro_ldg_decode_stream 2>&1 | tee $W/ldg_decode_stream.txt
timeout 150 $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLdgDecode/cuda:Backends/Fp4Linear.ExactPermutedDecode/cuda:Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/test.txt 2>&1
echo "-- test_cuda_fp4 ldg+perm rc=$? $(el): $(grep -c '^\[       OK' $W/test.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test.txt | head -3 | tr '\n' ' ')"
grep -B2 -A8 "Failure" $W/test.txt | head -30
echo "-- decode A/B $(el)"
timeout 150 $B/bench/bench_cuda_linear --bf16-input --m 1,16,64 --nk 7168:16384,4096:7168,24576:1536 --variants block-fp32-dynamic,mxfp4-group128 --envs ';FINEGEMM_FP4_DECODE_LDG=1;FINEGEMM_FP4_DECODE_LDG=1,FINEGEMM_PDL=1' >$W/decode.jsonl 2>$W/decode.err
grep -h '^{' $W/decode.jsonl | python3 -c 'import json,sys
for l in sys.stdin:
  r=json.loads(l); print("  %-20s %-26s M=%-3d N=%-6d K=%-6d us %8.2f graph %8.2f rel %.2e" % (r["variant"], r["env"], r["m"], r["n"], r["k"], r["us"], r["us_graph"], r["rel_err"]))'
tail -3 $W/decode.err
echo "-- MoE decode $(el)"
for env in X=1 FINEGEMM_FP4_DECODE_LDG=1; do
  env $env timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes $([ $env = X=1 ] && echo dynamic,fp4 || echo fp4) --check-tokens 1 >$W/moe_$env.jsonl 2>$W/moe_$env.err
  grep -h '^{' $W/moe_$env.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-28s T=%-3d %-18s layer %8.1f us graph %8.1f %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph", 0), r["check"]))' $env
done
if left $(( LIMIT - 150 )); then
  FINEGEMM_TEST_QUICK=1 timeout 100 compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLdgDecode/cuda' >$W/memcheck.txt 2>&1
  echo "-- memcheck rc=$? $(el): $(grep -h 'ERROR SUMMARY' $W/memcheck.txt | head -1)"
fi
if left $(( LIMIT - 110 )); then
  FINEGEMM_TEST_QUICK=1 timeout 100 compute-sanitizer --tool racecheck $B/tests/test_cuda_fp4 --gtest_filter='Backends/Fp4Linear.ExactLdgDecode/cuda' >$W/racecheck.txt 2>&1
  echo "-- racecheck rc=$? $(el): $(grep -h 'RACECHECK SUMMARY\|ERROR SUMMARY' $W/racecheck.txt | head -1)"
fi
if left $(( LIMIT - 50 )); then
  R=$W/ncu_ldg
  FINEGEMM_FP4_DECODE_LDG=1 timeout 50 ncu --clock-control none -k "regex:ldg" --launch-skip 4 --launch-count 1 -f -o $R \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters --import-source no \
    $B/bench/bench_cuda_linear --bf16-input --m 1 --nk 7168:16384 --variants mxfp4-group128 >$R.log 2>&1
  echo "-- ncu ldg rc=$? $(el)"
  ncu -i $R.ncu-rep --page details >$R.txt 2>&1
  ncu -i $R.ncu-rep --page source --print-source sass --csv >${R}_sass.csv 2>&1
  grep -E "Duration|SM Frequency|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots|Eligible Warps|Grid Size" $R.txt | head -12
  python3 ../scripts/sass-stalls ${R}_sass.csv --top 20 2>&1 | head -30 >${R}_stalls.txt; head -30 ${R}_stalls.txt
  rm -f $R.ncu-rep ${R}_sass.csv
fi
cd $OUT && tar czf all3.tgz w3 && rm -rf w3
echo "total $(( $(date +%s) - s0 )) s"
