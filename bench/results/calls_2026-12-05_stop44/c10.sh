#!/usr/bin/env bash
# Stop 44, call 10 (not yet run; meant for an H200, the bars' card; carry [".snap/prebuilt.txz", ".snap/c10.sh"];
# <= ~330 s, every section guarded by the elapsed time; run as C10_COMMIT=<commit> bash .snap/c10.sh): the bars
# nearest their line, re-measured on the card they name, after stop 44's H100-only calls.
# (1) Dense FP4 prefill M = 4096 N = 4096 K = 7168 beside FP8, three runs (issue 5: FP4 >= 85% of FP8; 84.6% on the
#     H200 at stop 43, 87.2-88.0% on the H100 at stop 44), with the scale warp's setting beside (FINEGEMM_GEMM_LEAN_SFB_WARP=1).
# (2) bench/linear.py at M = 4096 over issue 3's seven (N, K), cuBLASLt in the same run (the 1400 TFLOP/s bar at
#     N = 4096 K = 7168; the pairs sharing A, the default at K <= 1536 since stop 44; N = 2112 K = 7168, 111.5 µs on
#     the H100 against 95.4 on the H200 at stop 39).
# (3) The DeepSeek-V3 layer at T = 4096, FP4 (the wide scan's default) and FP8 (issue 5: FP4 >= 85% of FP8; issue 4:
#     the GEMMs' TFLOP/s), and T = 1 and 16 for both (issue 5's decode bar, 1.6x).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-5d N=%-6d K=%-6d %-30s graph=%8.2f us ev=%8.2f %6.0f TF/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r.get("tflops", 0) or 0, r["rel_err"]))
' $1; }
for rep in 1 2 3; do
  if left 90; then
    timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_GEMM_LEAN_SFB_WARP=1" >$W/dense_fp4_$rep.jsonl 2>$W/dense_fp4_$rep.err
    echo "-- dense FP4 and FP8, run $rep $(el)"; show $W/dense_fp4_$rep.jsonl
  fi
done
if left 170; then
  FINEGEMM_COMMIT=${C10_COMMIT:-unknown} timeout 90 python3 ../bench/linear.py --bench $B/bench/bench_cuda_linear --m 4096 \
    --nk 2112:7168,24576:1536,32768:512,7168:16384,4096:7168,7168:2048,576:7168 --variants block-fp32-dynamic \
    --out $W/linear_4096.json >$W/linear_4096.txt 2>$W/linear_4096.err
  echo "-- linear.py M = 4096 $(el)"; grep -vE "^\{" $W/linear_4096.txt | tail -12; tail -n 2 $W/linear_4096.err | cut -c1-200
fi
showmoe() { grep -vE "^#|^$" $1 | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us graph=%s" % (r["layer"], r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r.get("layer_us_graph")))
    else: print(l.rstrip()[:200])'; }
if left 260; then
  timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1,16,4096 --recipes fp4,dynamic --check-tokens 1 >$W/moe.log 2>&1
  echo "-- DeepSeek-V3 FP4 and FP8, T = 1, 16, 4096 $(el)"; showmoe $W/moe.log
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
