#!/usr/bin/env bash
# Stop 35 call 2 (carry [".snap"], binaries of 9c6d460): where MoE decode (DeepSeek-V3 T = 1) and dense decode lose
# bandwidth. The read ceiling (torch sum over 2 GB), the layer with forced decode splits, then ncu per kernel.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
python3 - <<'PY'
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").view(torch.int32); x.fill_(1)
y = torch.empty_like(x)
for name, f, nbytes in [("read (sum)", lambda: x.sum(), x.numel() * 4), ("copy", lambda: y.copy_(x), 2 * x.numel() * 4)]:
    for _ in range(3): f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize(); s.record()
    for _ in range(10): f()
    e.record(); torch.cuda.synchronize(); t = s.elapsed_time(e) / 10 * 1e-3
    print("%-10s %.3f TB/s" % (name, nbytes / t / 1e12))
PY
show() { python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l); print("  %s T=%d %s graph=%.1f us layer=%.1f gate_up=%.1f down=%.1f tbps=%.3f" % (sys.argv[1], r["T"], r["variant"], r["layer_us_graph"], r["layer_us"], r["gate_up_us"], r["down_us"], r["weight_tbps"]))
' "$1"; }
for s in '' 2 3 4; do
  FINEGEMM_FP4_DECODE_SPLIT=$s timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1 --recipes dynamic,fp4 --check-tokens 1 2>&1 | tee $W/moe_split$s.log | show "split='$s'"
done
echo "$(el)"
M="gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__throughput.avg.pct_of_peak_sustained_elapsed"
for s in '' 4; do
  FINEGEMM_PRINT_CONFIG=1 FINEGEMM_FP4_DECODE_SPLIT=$s timeout 120 ncu --clock-control none --launch-skip 40 --launch-count 14 --metrics $M --csv \
    $B/bench/bench_cuda_moe --layers deepseek-v3 --tokens 1 --recipes dynamic --check-tokens 1 --iter-scale 0.05 >$W/ncu_moe$s.csv 2>$W/ncu_moe$s.err
  echo "ncu moe split='$s' rc=$? $(el)"; grep -m3 "decode M=" $W/ncu_moe$s.err
  python3 - $W/ncu_moe$s.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; i = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = collections.OrderedDict()
for r in rows[1:]:
    k.setdefault((r[i["ID"]], r[i["Kernel Name"]][:60]), {})[r[i["Metric Name"]]] = r[i["Metric Value"]]
for (kid, name), m in k.items():
    t = float(m.get("gpu__time_duration.sum", "0").replace(",", "")); b = float(m.get("dram__bytes_read.sum", "0").replace(",", ""))
    print("  %4s %-60s %8.2f us grid=%6s dram%%=%5s read=%.1f MB -> %.2f TB/s sm%%=%s" % (kid, name, t / 1e3 if t > 1e4 else t, m.get("launch__grid_size"), m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"), b / 1e6, b / (t if t > 1e4 else t * 1e3) / 1e3 if t else 0, m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed")))
PY
done
timeout 120 ncu --clock-control none -k "regex:sm90_fp4_decode|splitk" --launch-skip 6 --launch-count 4 --metrics $M --csv \
  $B/bench/bench_cuda_linear --m 1 --nk 7168:16384,4096:7168 --variants block-fp32-dynamic >$W/ncu_dense.csv 2>$W/ncu_dense.err
echo "ncu dense rc=$? $(el)"; grep -E "Duration|dram" $W/ncu_dense.csv | head -0
python3 - $W/ncu_dense.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
for r in rows[1:]: print("  ", r[h.index("ID")], r[h.index("Kernel Name")][:50], r[h.index("Metric Name")], r[h.index("Metric Value")])
PY
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
