#!/usr/bin/env bash
# Stop 52: FINEGEMM_GROUPED_LEAN=192 looked faster at T = 16384 (one sample): alternate it with the default, and other
# values, three rounds, at T = 16384 and 4096. (Run as call 3 with the binaries of 8ad6afa; 160 and 224 are refused
# values: those runs aborted with the switch's error.)
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for rep in 1 2 3; do for T in 16384 4096; do for v in none 160 192 224; do
  [ $(( $(date +%s) - s0 )) -lt 330 ] || continue
  if [ $v = none ]; then e=FINEGEMM_NOTHING=1; else e=FINEGEMM_GROUPED_LEAN=$v; fi
  env $e timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens $T --recipes dynamic --check-tokens 1 >$W/moe_${T}_${v}_$rep.log 2>&1
  grep -h '^{' $W/moe_${T}_${v}_$rep.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("'$rep' lean='$v' T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s" % (r["T"], r["layer_us"], r["gemm_tflops"], r["check"]))'
done; done; done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
