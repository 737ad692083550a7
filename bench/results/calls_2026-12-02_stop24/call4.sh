#!/usr/bin/env bash
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt
s0=$(date +%s)
W=$OUT/w; mkdir -p $W
for t in test_cuda_capture_first test_ep_api test_cuda_edge test_cuda_moe_routing; do
  timeout 60 $B/tests/$t >$W/$t.txt 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/$t.txt | tr '\n' ' ') ($(( $(date +%s) - s0 )) s)"; grep -E "Failure" -A3 $W/$t.txt | head -6
done
for d in default 0; do
  env $( [ $d != default ] && echo FINEGEMM_MOE_DECODE=$d ) timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 512,1024,2048 --recipes dynamic --check-tokens 4 >$W/moe_d$d.jsonl 2>$W/moe_d$d.err
  echo "moe decode=$d rc=$? ($(( $(date +%s) - s0 )) s)"
  grep -o '"layer": "[a-z0-9-]*"\|"tokens": [0-9]*\|"layer_us": [0-9.]*\|"check": "[a-z]*"' $W/moe_d$d.jsonl | tr '\n' ' ' | sed 's/"layer":/\n"layer":/g'; echo
  [ $(( $(date +%s) - s0 )) -gt 250 ] && break
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
