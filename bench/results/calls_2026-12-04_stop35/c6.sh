#!/usr/bin/env bash
# Stop 35 call 4 (carry [".snap"], binaries of the landed default: lookahead on 192-row tiles only, decode load batch off):
# the whole GPU test suite, then the 42 shapes against cuBLASLt; first the read and copy ceilings (torch, 2 GB).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
python3 - <<'PY'
import torch
x = torch.empty(1 << 29, dtype=torch.float32, device="cuda"); x.fill_(1.0); y = torch.empty_like(x)
for name, f, nbytes in [("read (float sum)", lambda: x.sum(), x.numel() * 4), ("read (amax)", lambda: x.amax(), x.numel() * 4), ("copy", lambda: y.copy_(x), 2 * x.numel() * 4)]:
    for _ in range(3): f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize(); s.record()
    for _ in range(10): f()
    e.record(); torch.cuda.synchronize(); t = s.elapsed_time(e) / 10 * 1e-3
    print("%-16s %.3f TB/s" % (name, nbytes / t / 1e12))
PY
echo "== gpu-check test"
OUT=$W/test GPU_CHECK_DEADLINE=320 timeout 328 scripts/gpu-check test >$W/test.log 2>&1
echo "rc=$? $(el)"; tail -13 $W/test.log
grep -hE "^\[  FAILED|Failure|Which is|Expected" $W/test/*.log 2>/dev/null | head -12
echo "== 42 shapes $(el)"
left=$(( 585 - ($(date +%s) - s0) ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; grep -E "geomean" $W/linear42.log
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    if r["m"] >= 128: print("  M=%-4d N=%-6d K=%-6d %8.2f us vs cuBLASLt %8.2f  x%.3f" % (r["m"], r["n"], r["k"], min(r["us"], r["us_graph"] or 1e9), min(r["cublas_us"], r["cublas_us_graph"] or 1e9), r["speedup_vs_cublas"]))
' $W/linear42.json
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
