#!/usr/bin/env bash
# Stop 32 call 4 (carry [".snap"]: prebuilt.txz = fbe1382, FastDiv tile order + thread release by default;
# prebuilt_old.txz = 89e723c): GPU tests of the dense kernels on the new tile order, then the two binaries in turn on
# short-K shapes (same data per process, graph replay), then the 42 shapes on the new binary.
cd "$(dirname "$0")"
mkdir -p .pn .po && tar xJf prebuilt.txz -C .pn && tar xJf prebuilt_old.txz -C .po
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 150 .pn/tests/test_cuda_linear --gtest_filter='CudaLinearRecipes*:CudaTest.ThreadReleaseSameBits:CudaTest.SharedBTilesPastM:CudaTest.SharedATilesPastN:CudaTest.HoistedSplitSameBits:GemmConfig.*' >$W/test_lin.log 2>&1
echo "test_cuda_linear rc=$? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $W/test_lin.log | tail -8
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %-4s M=%-4d N=%-6d K=%-6d graph=%8.2f us rel=%.2e" % (sys.argv[2], r["m"], r["n"], r["k"], r["us_graph"], r["rel_err"]))
' $1 $2; }
for s in 4096:32768:512 128:32768:512 512:24576:1536 512:7168:2048 4096:7168:2048 512:32768:512 4096:24576:1536 4096:4096:7168; do
  [ $(( $(date +%s) - s0 )) -lt 260 ] || break
  IFS=: read -r m n k <<<"$s"
  for b in n o n o; do
    timeout 40 .p$b/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic >>$W/ab_${b}_${m}_${n}_${k}.txt 2>&1
  done
  echo "== M=$m N=$n K=$k $(el)"; show $W/ab_n_${m}_${n}_${k}.txt new; show $W/ab_o_${m}_${n}_${k}.txt old
done
echo "== 42 shapes (new) $(el)"
timeout 250 python3 bench/linear.py --bench .pn/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? $(el)"; grep -E "geomean" $W/linear42.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
