#!/usr/bin/env bash
# Stop 32 call 2 (carry [".snap"]: prebuilt.txz = main's binaries, prebuilt_ue.txz = exp/unit-epilogue's): the
# unit-epilogue test, then FINEGEMM_GEMM_UNIT_EPILOGUE=1 against its default on the same data, and the branch's default
# against main's (code growth near the tile change cost speed at stop 31).
cd "$(dirname "$0")"
mkdir -p .pm .pu && tar xJf prebuilt.txz -C .pm && tar xJf prebuilt_ue.txz -C .pu
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
timeout 120 .pu/tests/test_cuda_linear --gtest_filter='CudaTest.UnitEpilogueSameBits:CudaTest.ThreadReleaseSameBits' >$W/test_ue.log 2>&1
echo "test rc=$? $(el)"; grep -E "OK|FAILED|PASSED" $W/test_ue.log | tail -5
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  %s M=%-4d N=%-6d K=%-6d env=%-22s graph=%8.2f us rel=%.2e" % (sys.argv[2], r["m"], r["n"], r["k"], (r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us_graph"], r["rel_err"]))
' $1 $2; }
U=FINEGEMM_GEMM_UNIT_EPILOGUE
for s in 4096:32768:512 512:24576:1536 128:32768:512 4096:7168:2048 512:7168:2048 4096:4096:7168; do
  [ $(( $(date +%s) - s0 )) -lt 420 ] || break
  IFS=: read -r m n k <<<"$s"
  timeout 60 .pu/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs ";$U=1;;$U=1" >$W/ue_${m}_${n}_${k}.txt 2>&1
  timeout 60 .pm/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic --envs ";" >$W/main_${m}_${n}_${k}.txt 2>&1
  echo "== M=$m N=$n K=$k $(el)"; show $W/ue_${m}_${n}_${k}.txt ue; show $W/main_${m}_${n}_${k}.txt main
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
