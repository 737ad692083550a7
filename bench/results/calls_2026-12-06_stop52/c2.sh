#!/usr/bin/env bash
# Stop 52, call 2 (carry [".snap/prebuilt.txz", ".snap/c2.sh"]; <= ~420 s). FINEGEMM_GROUPED_LEAN=192 measured 9-10%
# faster on the DeepSeek-V3 FP8 layer at T = 16384 (call 1, H100), not at T = 4096. (1) ncu per launch of the layer at
# T = 16384 (default, =192, FP4 default): which GEMM takes the time; (2) A/B, three rounds: DeepSeek-V3 T = 8192 and
# 16384 (dynamic, ue8m0, static, fp4), Qwen3-30B-A3B T = 4096 and 16384 (dynamic), default against =192 and =256.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for run in "dynamic FINEGEMM_NOTHING=1" "dynamic FINEGEMM_GROUPED_LEAN=192" "fp4 FINEGEMM_NOTHING=1" "fp4 FINEGEMM_GROUPED_LEAN=192"; do
  set -- $run
  if left 150; then
    env $2 timeout 80 ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 40 \
      $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes $1 --check-tokens 1 --iter-scale 1 >$W/ncu_$1_$2.csv 2>$W/ncu_$1_$2.err
    echo "-- ncu $1 $2 $(el)"
    python3 - $W/ncu_$1_$2.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: print("  no rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
for r in rows[1:]:
    name = r[ki].split("(")[0].split("<")[0][-40:]
    if "fill" in name: continue
    v = float(r[vi].replace(",", "")); u = r[ui]
    us = v / 1000 if u == "nsecond" or u == "ns" else v * 1000 if u in ("msecond", "ms") else v
    if us > 5: print("  %-40s %10.1f us  %s" % (name, us, r[ki][:110] if "gemm" in r[ki].lower() else ""))
PY
  fi
done
moe() {  # tag, layer, tokens, recipes, env
  env $5 timeout 100 $B/bench/bench_cuda_moe --layers $2 --tokens $3 --recipes $4 --check-tokens 1 >$W/moe_$1.log 2>&1
  grep -h '^{' $W/moe_$1.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-32s %-14s %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s" % ("'"$5"'", r["layer"], r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"]))'
  grep -hiE "error|fail|terminate" $W/moe_$1.log | head -3
}
for rep in 1 2 3; do
  for e in FINEGEMM_NOTHING=1 FINEGEMM_GROUPED_LEAN=192 FINEGEMM_GROUPED_LEAN=256; do
    if left 380; then
      moe ds_${rep}_${e##*=} deepseek-v3 8192,16384 dynamic,ue8m0,static,fp4 $e
      moe qw_${rep}_${e##*=} qwen3-30b-a3b 4096,16384 dynamic $e
    fi
  done
  echo "-- round $rep $(el)"
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
