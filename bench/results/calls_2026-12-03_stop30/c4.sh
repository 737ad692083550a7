#!/usr/bin/env bash
# Stop 30 call 4 (env switches only, binaries of f0f1ca2): (a) tile configs at the M = 64 / 128 shapes under 1.0x
# cuBLASLt in call 1 (N = 24576 K = 1536, N = 32768 K = 512), same data, graph replay; (b) the FP4 GEMV against the
# decode kernel at small N (where call 3 had it ahead: N = 576) and at M = 1, 2, 4, 8 (call 3: M = 1 slower than 8).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  M=%-3d N=%-6d K=%-6d %-16s env=%-34s graph=%8.2f rel=%.2e" % (r["m"], r["n"], r["k"], r["variant"], (r["env"] or "default").replace("FINEGEMM_",""), r["us_graph"], r["rel_err"]))
' $1; }
C=FINEGEMM_GEMM_CONFIG
for s in 128:32768:512 128:24576:1536 64:24576:1536; do
  IFS=: read -r m n k <<<"$s"
  FINEGEMM_PRINT_CONFIG=1 timeout 80 $B/bench/bench_cuda_linear --m-major-scales --m $m --nk $n:$k --variants block-fp32-dynamic \
    --envs ";$C=64x128:1;$C=64x64:1;$C=128x64:1;$C=128x192:1;$C=192x128:1;$C=128x256:1;$C=128x128:1c2;$C=192x128:1c2a;$C=64x128:2;$C=128x128:2" >$W/cfg_${m}_${n}.txt 2>$W/cfg_${m}_${n}.err
  echo "== M=$m N=$n K=$k rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/cfg_${m}_${n}.err | head -1)"; show $W/cfg_${m}_${n}.txt
done
for nk in 576:7168 1024:7168 1536:7168 2112:7168 576:2048; do
  timeout 60 $B/bench/bench_cuda_linear --m 1,2,4,8 --nk $nk --variants mxfp4-group128 --envs 'FINEGEMM_FP4_GEMV=0;FINEGEMM_FP4_GEMV=1' >$W/gemv_${nk/:/_}.txt 2>&1
  echo "== gemv $nk rc=$? ($(( $(date +%s) - s0 )) s)"; show $W/gemv_${nk/:/_}.txt
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
