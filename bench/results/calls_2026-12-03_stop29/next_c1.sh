#!/usr/bin/env bash
# Prepared at stop 29 for the next session's first call (copy into .snap after scripts/pack-prebuilt; carry [".snap"]):
# (a) ScaleCopyByLoaderSameBits; (b) FINEGEMM_GEMM_SCALE_COPY_LOADER=1 against the default at M = 512 and 4096 (each
# pair twice, same data, graph replay); (c) the 42 shapes with stop 29's defaults (one-box B, 192x128 at K <= 512).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-40s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % ((r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
run() {  # m n:k envs limit_s
  [ $(( $(date +%s) - s0 )) -lt $4 ] || { echo "skipped M=$1 $2"; return; }
  local f=$W/s_$1_${2/:/_}
  FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m $1 --nk $2 --variants block-fp32-dynamic --envs "$3" >$f.txt 2>$f.err
  echo "== M=$1 $2 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $f.err | head -1)"; show $f.txt
}
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.ScaleCopyByLoaderSameBits' >$W/t_scl.txt 2>&1
echo "ScaleCopyByLoaderSameBits rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_scl.txt | tr '\n' ' ')"; grep -B2 -A6 Failure $W/t_scl.txt | head -30
L=FINEGEMM_GEMM_SCALE_COPY_LOADER=1
for nk in 4096:7168 7168:16384 24576:1536; do run 512 $nk ";$L;;$L" 150; done
for nk in 7168:16384 4096:7168 24576:1536 2112:7168; do run 4096 $nk ";$L;;$L" 280; done
echo "== bench/linear 42 shapes ($(( $(date +%s) - s0 )) s)"
timeout $(( 580 - ($(date +%s) - s0) )) python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; tail -48 $W/linear42.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
