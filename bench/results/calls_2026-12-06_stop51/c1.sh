#!/usr/bin/env bash
# Stop 51, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"] after scripts/pack-prebuilt; <= ~480 s). Stop 50's c3.sh
# with the chained gated launches added (FINEGEMM_FP4_GATE_PDL=1, never run before): (0) the tests of the fused
# scan+expansion (4 K blocks per CTA, never run) and of the chained gates, first; (1) the power cap under a sustained
# FP8 GEMM; (2) ncu per launch of the dense FP4 prefill (default, fused); (3) the dense bar rows with the four
# combinations of the fused kernel and the chained gates, twice; (4) finegemm and cuBLASLt under sustained load.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
# The fused scan+expansion's tests first (rewritten at stop 50's end for 4 K blocks per CTA, never run): exact, and the
# default kernels' bits, dense and grouped. Its timings below count only if these pass.
timeout 200 $B/tests/test_cuda_fp4 --gtest_filter='*/Fp4Linear.ExactWideExpansion/*:*/Fp4Linear.ExactGatesChained/*:*/Fp4Moe.ExpertsWithCraftedSpreadsMatchReference/*' >$W/fused_tests.log 2>&1
echo "-- fused kernel's tests rc=$? $(el): $(grep -hE '^\[  (PASSED|FAILED)  \]' $W/fused_tests.log | tr '\n' ' ')"
grep -hE "^\[  FAILED  \]|Failure" $W/fused_tests.log | head -6
grep -hE "^\[       OK \]" $W/fused_tests.log
timeout 30 $B/tests/test_cuda_linear --gtest_filter='GemmConfig.*' >$W/switch_tests.log 2>&1
echo "-- switch tests rc=$?: $(grep -hE '^\[  (PASSED|FAILED)  \]' $W/switch_tests.log | tr '\n' ' ')"
for rep in 1; do
  if left 300; then
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=3;FINEGEMM_FP4_GATE_PDL=1;FINEGEMM_FP4_EXPAND_WIDE=3,FINEGEMM_FP4_GATE_PDL=1" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  fi
done
echo "-- dense prefill $(el)"; cat $W/dense_*.jsonl 2>/dev/null | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%d N=%d K=%d %-18s %-28s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["env"] or "default", r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'
for mode in default 3; do
  if left 330; then
    envset=FINEGEMM_NOTHING=1; [ $mode = 3 ] && envset=FINEGEMM_FP4_EXPAND_WIDE=3
    env $envset timeout 90 ncu --clock-control none --cache-control all \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --launch-count 16 \
      $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants mxfp4-group128 >$W/ncu_fp4_$mode.txt 2>&1
    echo "-- ncu, the dense FP4 prefill's launches ($mode) $(el)"
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes" $W/ncu_fp4_$mode.txt | sed 's/  */ /g' | cut -c1-150 | head -50
  fi
done
if left 370; then
  timeout 60 ncu --clock-control none --cache-control all -k "regex:sm90_fp8_gemm_lean" --launch-count 2 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168 --variants block-fp32-dynamic >$W/ncu_fp8.txt 2>&1
  echo "-- ncu, the FP8 lean kernel $(el)"; grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes" $W/ncu_fp8.txt | sed 's/  */ /g' | cut -c1-150
fi
if echo "$(nvidia-smi --query-gpu=name --format=csv,noheader)" | grep -q H200 && left 280; then
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
fi
# Sustained load, the same data and shapes on both sides: finegemm's graph replayed back to back for 3 s
# (bench_cuda_linear --sustain-ms, us_sustained), cuBLASLt's block-scaled FP8 (1x128 x 128x128) likewise through
# torch: who does more FLOPs under the power cap.
if left 330; then
  timeout 80 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants block-fp32-dynamic,mxfp4-group128 --sustain-ms 3000 >$W/sustain.jsonl 2>$W/sustain.err
  echo "-- sustained, finegemm $(el)"; grep -h '^{' $W/sustain.jsonl | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); f = 2.0 * r["m"] * r["n"] * r["k"]
    print("  M=%d N=%d K=%d %-18s event=%8.2f graph=%8.2f sustained=%8.2f us (%.0f TFLOP/s sustained) rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["us"], r["us_graph"], r["us_sustained"], f / r["us_sustained"] / 1e6 if r["us_sustained"] else 0, r["rel_err"]))'
  timeout 60 python3 - >$W/sustain_cublas.txt 2>&1 <<'PY'
import time, torch
import torch.nn.functional as F
for n, k in [(4096, 7168), (7168, 16384)]:
    m = 4096; L = k // 128; L4 = (L + 3) // 4 * 4
    copies = max(1, (3 * 60 * 2**20) // (n * k) + 2)
    w = [torch.randn(n, k, device="cuda").mul(64).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(copies)]
    sb = F.pad(torch.rand((n + 127) // 128, L, device="cuda") / 256 + 0.5 / 256, (0, L4 - L)).t()
    x = torch.randn(m, k, device="cuda").mul(64).clamp(-448, 448).to(torch.float8_e4m3fn)
    sa = (torch.rand(m, L, device="cuda") / 256 + 0.5 / 256).t().contiguous().t()
    f = lambda i: F.scaled_mm(x, w[i % copies].t(), sa, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph(); st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for i in range(copies): f(i)
        with torch.cuda.graph(g, stream=st):
            for i in range(copies): f(i)
    torch.cuda.current_stream().wait_stream(st); g.replay(); torch.cuda.synchronize()
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    batches = []; t0 = time.time()
    while time.time() - t0 < 3.0:
        s0.record()
        for _ in range(8): g.replay()
        s1.record(); s1.synchronize(); batches.append(s0.elapsed_time(s1) * 1e3)
    half = batches[len(batches) // 2:]
    us = sum(half) / (len(half) * 8 * copies)
    print("cuBLASLt M=%d N=%d K=%d sustained %.2f us (%.0f TFLOP/s)" % (m, n, k, us, 2.0 * m * n * k / us / 1e6))
PY
  cat $W/sustain_cublas.txt | tail -4
fi
for rep in 2; do
  if left 420; then
    timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 4096:7168,7168:16384 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_EXPAND_WIDE=3;FINEGEMM_FP4_GATE_PDL=1;FINEGEMM_FP4_EXPAND_WIDE=3,FINEGEMM_FP4_GATE_PDL=1" >$W/dense_$rep.jsonl 2>$W/dense_$rep.err
  fi
done
echo "-- dense prefill $(el)"; cat $W/dense_*.jsonl 2>/dev/null | grep -h '^{' | python3 -c '
import sys, json
for l in sys.stdin:
    r = json.loads(l); print("  M=%d N=%d K=%d %-18s %-28s graph=%8.2f us event=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], r["env"] or "default", r["us_graph"] or 0, r["us"] or 0, r["rel_err"] or 0))'
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
