#!/usr/bin/env bash
# Stop 29 call 2: is the one-wave GEMM bound by the stages in flight (Little's law: M = 512 runs ~535 ns per K block,
# cuBLASLt ~450; with ~2 us of load latency, 4 stages in flight allow ~530 ns, 5 ~430)? The consumers hold fewer
# stages with the early release (before the promotion's FMAs) and with one accumulator set (pingpong). Same data per
# shape, graph replay. Also 128x256 tiles for the short-K wide shapes (one wave, the whole K in flight at once), and
# the new L2 prefetch of B tiles D K blocks ahead of the ring (FINEGEMM_GEMM_L2_PREFETCH, its same-bits test first).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-58s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % ((r["env"] or "default").replace("FINEGEMM_GEMM_",""), r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
run() {  # m n:k envs limit_s
  [ $(( $(date +%s) - s0 )) -lt $4 ] || { echo "skipped M=$1 $2"; return; }
  local f=$W/s_$1_${2/:/_}
  FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --m-major-scales --m $1 --nk $2 --variants block-fp32-dynamic --envs "$3" >$f.txt 2>$f.err
  echo "== M=$1 $2 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $f.err | head -1)"; show $f.txt
}
timeout 150 $B/tests/test_cuda_linear --gtest_filter='CudaTest.L2PrefetchSameBits' >$W/t_l2.txt 2>&1
echo "L2PrefetchSameBits rc=$? ($(( $(date +%s) - s0 )) s) $(grep -E '^\[  (PASSED|FAILED) ' $W/t_l2.txt | tr '\n' ' ')"; grep -B2 -A6 Failure $W/t_l2.txt | head -30
L4=FINEGEMM_GEMM_L2_PREFETCH=4; L8=FINEGEMM_GEMM_L2_PREFETCH=8
ER=FINEGEMM_GEMM_EARLY_RELEASE=1; SA=FINEGEMM_GEMM_DOUBLE_ACC=0; NP=FINEGEMM_GEMM_PINGPONG=0; T=FINEGEMM_GEMM_CONFIG
E=";$L4;$L8;$ER;$ER,$L4;$SA,$ER;$SA,$ER,$L4;$SA,$NP,$ER"
for nk in 4096:7168 7168:16384 7168:2048 24576:1536 32768:512 2112:7168; do
  X=""; case $nk in 24576:1536|32768:512) X=";$T=128x256:1;$T=128x256:1,$ER";; esac
  case $nk in 2112:7168) X=";$T=128x128:1;$T=128x128:1,$ER;$T=128x128:1,$SA,$ER";; esac
  run 512 $nk "$E$X" 260
done
for nk in 32768:512 24576:1536 7168:16384; do run 128 $nk ";$T=128x256:1;$T=128x256:1,$L4;$L4;$ER,$L4" 320; done
for nk in 7168:16384 24576:1536 4096:7168; do run 64 $nk ";$L4;$L8;FINEGEMM_GEMM_L2_PREFETCH=16" 360; done
for nk in 4096:7168 7168:2048 32768:512 7168:16384; do run 4096 $nk ";$L4;$ER;$ER,$L4;$T=128x128:1,$L4;$T=128x128:1,$SA,$ER" 480; done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
