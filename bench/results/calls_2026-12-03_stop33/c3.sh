#!/usr/bin/env bash
# Stop 33 call 3 (carry [".snap"]: prebuilt.txz of the TMA-store default with 128x64, 128x192 and 192x128-alone
# instantiations added, and the grouped TMA store under FINEGEMM_GROUPED_TMA_STORE=1): the whole GPU test suite on the
# new default, the 42 shapes, the DeepSeek-V3 MoE layer at T = 4096 with BF16 y and the grouped TMA store off / on,
# then the default against FINEGEMM_GEMM_TMA_STORE=0 on the shapes whose picks the new instantiations serve (same data
# per process, graph replay).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
echo "== gpu-check test"
OUT=$W/test timeout 290 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -12 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== 42 shapes $(el)"
timeout 230 python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; grep -E "geomean" $W/linear42.log
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["m"] >= 64: print("  M=%-4d N=%-6d K=%-6d %8.2f us vs cuBLASLt %8.2f  x%.3f" % (r["m"], r["n"], r["k"], r["us_graph"], r["cublas_us_graph"], r["speedup_vs_cublas"]))
' $W/linear42.json
for g in 0 1 0 1; do
  [ $(( $(date +%s) - s0 )) -lt 500 ] || break
  FINEGEMM_MOE_Y=bf16 FINEGEMM_GROUPED_TMA_STORE=$g timeout 45 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic --check-tokens 4 >>$W/moe_g$g.jsonl 2>>$W/moe_g$g.err
  echo "moe y=bf16 grouped_tma_store=$g rc=$? $(el)"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-14s T=%-6d %-6s layer_us=%9.1f gemm_tflops=%6.1f" % (r["layer"], r["T"], r["check"], r["layer_us"], r["gemm_tflops"]))
' $W/moe_g$g.jsonl | tail -1
done
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-4d N=%-6d K=%-6d env=%-34s graph=%8.2f us rel=%.2e" % (r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_TMA_STORE
for s in 128:24576:1536: 512:2112:7168: 128:32768:512:192x128:1 4096:2112:7168: 128:32768:512: 4096:24576:1536:; do
  [ $(( $(date +%s) - s0 )) -lt 555 ] || break
  IFS=: read -r m n k cfg <<<"$s"
  if [ -n "$cfg" ]; then export FINEGEMM_GEMM_CONFIG=$cfg; else unset FINEGEMM_GEMM_CONFIG; fi
  FINEGEMM_PRINT_CONFIG=1 timeout 40 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs ";$T=0;;$T=0" >$W/ab_${m}_${n}_${k}_${cfg}.txt 2>$W/ab_${m}_${n}_${k}_${cfg}.err
  echo "== M=$m N=$n K=$k ${cfg:-default} $(el) pick: $(grep -m1 'finegemm: gemm' $W/ab_${m}_${n}_${k}_${cfg}.err | sed 's/.*-> //')"; show $W/ab_${m}_${n}_${k}_${cfg}.txt
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
