#!/usr/bin/env bash
# Stop 40, call 3 (carry [".snap"] after scripts/pack-prebuilt; ~4 min): the dense decode A/B of the in-kernel split-K
# finish (FINEGEMM_DECODE_SPLIT_FINISH=1, stop 37; same bits on the H200, never timed dense) over issue 3's seven
# shapes at M = 1/16/64, E4M3 and FP4, graph replay; then ncu on the decode kernels of the two shapes furthest from
# the bars (N = 4096 K = 7168 E4M3 at 2.32 TB/s against 3.0; FP4 N = 7168 K = 16384 at 36.8 us against ~22); between
# them the grouped lean kernel at DeepSeek-V3 T = 16384.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-20s M=%-3d N=%-6d K=%-6d %-32s graph=%8.2f us %6.2f TB/s rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, (r.get("gbps") or 0) / 1000, r["rel_err"]))
' $1; }
for s in 7168:16384 4096:7168 2112:7168 576:7168 24576:1536 32768:512 7168:2048; do
  timeout 45 $B/bench/bench_cuda_linear --m 1,16,64 --nk $s --variants block-fp32-dynamic,mxfp4-group32 --envs ";FINEGEMM_DECODE_SPLIT_FINISH=1" >$W/dec_${s/:/_}.jsonl 2>$W/dec_${s/:/_}.err
  echo "-- $s $(el)"; show $W/dec_${s/:/_}.jsonl
done
# The grouped lean kernel (FINEGEMM_GROUPED_LEAN, off) at T = 16384 (512 rows per expert: where the dense lean kernel's
# tile economics should carry over; stop 39 measured it only at T = 2048 and 4096). Bar: 1250 TFLOP/s (728 by default).
for e in "" "FINEGEMM_GROUPED_LEAN=256" "FINEGEMM_GROUPED_LEAN=192"; do
  env $e timeout 70 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes dynamic --check-tokens 1 >$W/moe16k_${e##*=}.log 2>&1
  echo "-- deepseek-v3 T=16384 ${e:-default} $(el)"; grep -vE "^#|^$" $W/moe16k_${e##*=}.log | python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %-22s T=%-5d check=%s rel=%.2e layer=%9.1f us gemm %6.1f TF" % (r["variant"], r["T"], r["check"], r["rel_err"], r["layer_us"], r["gemm_tflops"]))
    else: print(l.rstrip()[:200])'
done
OUT=$W/prof PROFILE_SHAPES="1:4096:7168 1:7168:16384:mxfp4-group128" timeout 150 scripts/gpu-check profile >$W/prof.log 2>&1
echo "profile rc=$? $(el)"; tail -30 $W/prof.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
