#!/usr/bin/env bash
# NOTE (after the run): its test filter */cuda.ExactLdgDecode matched nothing (the names end in /cuda), so the quick
# test and memcheck ran no test; and without --bf16-input bench_cuda_linear passes E4M3 activations, which the permuted
# and direct-copy kernels never take. Calls 2-4 redid both by hand (stop60_call1_2026-12-07_cafb383.json).
# Stop 60, call 5 (the budget's last minutes; LIMIT=<s>): the FP4 direct-copy decode kernel (FINEGEMM_FP4_DECODE_LDG=1)
# in short: (1) its quick exactness test and the MoE test's rows; (2) dense decode by graph replay, FP8 against FP4 as
# it is, with the switch, and with the switch and programmatic launches (M = 1 / 16 / 64, the two bar shapes);
# (3) MoE decode DeepSeek-V3 T = 1 / 16 with and without it; (4) memcheck of the quick test if time is left.
cd "$(dirname "$0")"
[ -d .prebuilt ] || { mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; }
B=.prebuilt; s0=$(date +%s); W=$OUT/w5; mkdir -p $W; LIMIT=${LIMIT:-260}
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name --format=csv,noheader
FINEGEMM_TEST_QUICK=1 timeout 80 $B/tests/test_cuda_fp4 --gtest_filter='*/cuda.ExactLdgDecode:Backends/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/cuda' >$W/test.txt 2>&1
echo "-- tests rc=$? $(el): $(grep -c '^\[       OK' $W/test.txt) passed; $(grep -h '^\[  FAILED\|^\[  PASSED' $W/test.txt | head -3 | tr '\n' ' ')"
grep -B2 -A8 "Failure" $W/test.txt | head -24
echo "-- decode A/B $(el)"
timeout 100 $B/bench/bench_cuda_linear --m 1,16,64 --nk 7168:16384,4096:7168 --variants block-fp32-dynamic,mxfp4-group128 --envs ';FINEGEMM_FP4_DECODE_LDG=1;FINEGEMM_FP4_DECODE_LDG=1,FINEGEMM_PDL=1' >$W/decode.jsonl 2>$W/decode.err
grep -h '^{' $W/decode.jsonl | python3 -c 'import json,sys
for l in sys.stdin:
  r=json.loads(l); print("  %-20s %-36s M=%-3d N=%-6d K=%-6d us %8.2f graph %8.2f rel %.2e" % (r["variant"], r["env"], r["m"], r["n"], r["k"], r["us"], r["us_graph"], r["rel_err"]))'
tail -2 $W/decode.err
if left $(( LIMIT - 60 )); then
  echo "-- MoE decode $(el)"
  for env in X=1 FINEGEMM_FP4_DECODE_LDG=1; do
    env $env timeout 40 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16 --recipes $([ $env = X=1 ] && echo dynamic,fp4 || echo fp4) --check-tokens 1 >$W/moe_$env.jsonl 2>$W/moe_$env.err
    grep -h '^{' $W/moe_$env.jsonl | python3 -c 'import json,sys
for l in sys.stdin: r=json.loads(l); print("  %-28s T=%-3d %-18s layer %8.1f us graph %8.1f %s" % (sys.argv[1], r["T"], r["variant"], r["layer_us"], r.get("layer_us_graph", 0), r["check"]))' $env
  done
fi
if left $(( LIMIT - 45 )); then
  FINEGEMM_TEST_QUICK=1 timeout $(( LIMIT - 10 - ($(date +%s) - s0) )) compute-sanitizer --tool memcheck $B/tests/test_cuda_fp4 --gtest_filter='*/cuda.ExactLdgDecode' >$W/memcheck.txt 2>&1
  echo "-- memcheck rc=$? $(el): $(grep -h 'ERROR SUMMARY' $W/memcheck.txt | head -1)"
fi
cd $OUT && tar czf all5.tgz w5 && rm -rf w5
echo "total $(( $(date +%s) - s0 )) s"
