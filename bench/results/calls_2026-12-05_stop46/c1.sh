#!/usr/bin/env bash
# Stop 46, call 1 (carry [".snap/prebuilt.txz", ".snap/c1.sh"]; <= ~300 s):
# (1) FINEGEMM_FP4_DECODE_PIPE=1 (the fixed build, no C75xx): its test, then its A/B against the default, FP8 beside;
# (2) ncu source-level stalls of the FP4 decode kernel and of the E4M3 decode kernel at M = 1 N = 7168 K = 16384, to
#     attribute the FP4 kernel's time to the loader, the preparer and the consumers (per-instruction CSV).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
left() { [ $(( $(date +%s) - s0 )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-18s M=%-4d N=%-6d K=%-6d %-30s graph=%8.2f us ev=%8.2f rel=%.2e" % (r["variant"], r["m"], r["n"], r["k"], (r["env"] or "default"), r["us_graph"] or 0, r["us"], r["rel_err"]))
' $1; }
timeout 60 $B/tests/test_cuda_fp4 --gtest_filter='*ExactPipelinedDecode*' >$W/fp4.log 2>&1
echo "tests rc=$? $(el)"; grep -hE "^\[  (PASSED|FAILED)|Failure|never ran" $W/fp4.log | head -8; tail -n 1 $W/fp4.log
for rep in 1 2; do
  if left 150; then
    timeout 60 $B/bench/bench_cuda_linear --m 1,16,32,64 --nk 7168:16384,4096:7168 --variants mxfp4-group128,block-fp32-dynamic --envs ";FINEGEMM_FP4_DECODE_PIPE=1" >$W/pipe_$rep.jsonl 2>$W/pipe_$rep.err
    echo "-- FP4 decode default / pipelined, FP8 beside, run $rep $(el)"; show $W/pipe_$rep.jsonl
  fi
done
prof() {  # name variant
  timeout 80 ncu --set full --import-source no -k "regex:sm90_fp4_decode_kernel" --launch-skip 4 --launch-count 1 -o $W/$1 \
    $B/bench/bench_cuda_linear --m 1 --nk 7168:16384 --variants $2 >$W/$1.log 2>&1
  echo "-- ncu $1 rc=$? $(el)"
  ncu --import $W/$1.ncu-rep --page details >$W/$1_details.txt 2>&1
  ncu --import $W/$1.ncu-rep --page source --csv --print-source sass >$W/$1_sass.csv 2>$W/$1_sass.err
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit" $W/$1_details.txt | sed 's/  */ /g' | head -24
  wc -c $W/$1_sass.csv; head -c 300 $W/$1_sass.err
  rm -f $W/$1.ncu-rep
}
if left 200; then prof ncu_fp4 mxfp4-group128; fi
if left 250; then prof ncu_fp8 block-fp32-dynamic; fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
