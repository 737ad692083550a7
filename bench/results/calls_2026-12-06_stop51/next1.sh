#!/usr/bin/env bash
# For the next session's first call (written at stop 51's end; carry [".snap/prebuilt.txz", ".snap/next1.sh"] after
# scripts/pack-prebuilt; <= ~400 s). Stop 51 ran only on H100s; on whichever card comes: (1) the power cap under a
# sustained FP8 GEMM (the H200's never measured); (2) the dense FP4 prefill with the fused scan+expansion (the default
# since stop 51) against the two kernels (FINEGEMM_FP4_EXPAND_WIDE=0), FP8 beside, four rounds, the bar's rows;
# (3) the DeepSeek-V3 FP4 layer at T = 16384 (512 rows per expert: the expanded grouped path) by default and with
# the fused kernel for grouped expansions (FINEGEMM_FP4_EXPAND_WIDE=3), the FP8 layer beside, each checked.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
Q=timestamp,clocks.sm,power.draw.instant,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown,temperature.gpu
nvidia-smi --query-gpu=$Q --format=csv,noheader -lms 20 >$W/power.csv 2>$W/power.err &
PW=$!
timeout 40 python3 - >$W/burn.txt 2>&1 <<'PY'
import time, torch
M = N = K = 8192
a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
one = torch.tensor(1.0, device="cuda")
f = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
f(); torch.cuda.synchronize()
t0 = time.time(); n = 0
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
while time.time() - t0 < 4.0:
    for _ in range(20): f()
    n += 20
    torch.cuda.synchronize()
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e)
print("sustained FP8 GEMM %d^3: %d calls, %.1f TFLOP/s" % (M, n, 2.0 * M * N * K * n / (ms * 1e-3) / 1e12))
PY
kill $PW; wait $PW 2>/dev/null
echo "-- power $(el)"; cat $W/burn.txt; head -2 $W/power.err
python3 - $W/power.csv <<'PY'
import sys
rows = []
for l in open(sys.argv[1]):
    f = [x.strip() for x in l.split(",")]
    try: rows.append((float(f[1].split()[0]), float(f[2].split()[0]), f[3], f[4], f[5], f[6]))
    except (ValueError, IndexError): pass
busy = [r for r in rows if r[1] > 250]
print("  samples %d, busy (> 250 W) %d" % (len(rows), len(busy)))
if busy:
    cl = sorted(r[0] for r in busy); pw = sorted(r[1] for r in busy)
    cap = sum(1 for r in busy if r[2] == "Active"); hw = sum(1 for r in busy if r[3] == "Active"); th = sum(1 for r in busy if r[4] == "Active")
    print("  busy SM clock MHz min %.0f median %.0f max %.0f; power W median %.0f max %.0f; sw power cap active in %d, hw slowdown %d, thermal %d; temp %s" % (cl[0], cl[len(cl)//2], cl[-1], pw[len(pw)//2], pw[-1], cap, hw, th, busy[-1][5]))
PY
for rep in 1 2 3 4; do
  if left 200; then
    timeout 50 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=0" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  fi
done
echo "-- dense rounds $(el)"
cat $W/dense_*.jsonl | grep -h '^{' | python3 -c '
import sys, json, collections, statistics as st
g = collections.defaultdict(list); e = collections.defaultdict(list)
for l in sys.stdin:
    r = json.loads(l); k = (r["n"], r["k"], r["variant"], r["env"] or "default"); g[k].append(r["us_graph"]); e[k].append(r["us"])
for k in sorted(g):
    f8 = st.median(g[(k[0], k[1], "block-fp32-dynamic", "default")])
    print("  N=%d K=%d %-18s %-28s graph %s median %.2f (%.1f%% of FP8 default)  event median %.2f" % (k[0], k[1], k[2], k[3], " ".join("%.1f" % v for v in g[k]), st.median(g[k]), 100 * f8 / st.median(g[k]), st.median(e[k])))'
moe() {  # name, recipe, env...
  local name=$1 r=$2; shift 2
  env "$@" timeout 120 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 16384 --recipes $r --check-tokens 1 >$W/moe_$name.log 2>&1
  echo "-- MoE $name ($*) $(el)"; grep -h '^{' $W/moe_$name.log | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  %-22s T=%-5d layer=%9.1f us gemm=%6.1f TFLOP/s check=%s rel=%.2e" % (r["variant"], r["T"], r["layer_us"], r["gemm_tflops"], r["check"], r["rel_err"]))'
  grep -hiE "error|fail" $W/moe_$name.log | head -3
}
if left 240; then moe fp4_default fp4 FINEGEMM_NOTHING=1; fi
if left 290; then moe fp4_fused fp4 FINEGEMM_FP4_EXPAND_WIDE=3; fi
if left 330; then moe fp8 dynamic FINEGEMM_NOTHING=1; fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
