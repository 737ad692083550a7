#!/usr/bin/env bash
# Stop 45, call 8 (H200 wanted): dense FP4 prefill against FP8 (issue 5: >= 85%), three runs in one process each, then
# the DeepSeek-V3 layer FP4 and FP8 at T = 1, 16, 4096 (issue 5 MoE decode 1.6x and prefill 85%; issue 4).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for rep in 1 2 3; do
  timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  echo "-- dense FP4 and FP8, run $rep $(el)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%d N=%d K=%d graph=%.2f us ev=%.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], r["us_graph"] or 0, r["us"], r["rel_err"]))' $W/dense_$rep.jsonl
done
timeout 90 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes fp4,dynamic --check-tokens 1 >$W/moe.log 2>&1
echo "-- DeepSeek-V3 $(el)"; grep -vE "^#|^$" $W/moe.log | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us graph=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r.get("layer_us_graph")))
    else: print(l.rstrip()[:200])'
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
