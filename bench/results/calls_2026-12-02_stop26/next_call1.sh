#!/usr/bin/env bash
# Stop 27's first call (after scripts/pack-prebuilt; cp this into .snap; carry [".snap"]).
# 1. The sanitizers with stop 26's additions: racecheck of the stage-ring probe (one CTA / pair with our remote
#    arrival / pair with .release.cluster) and of the default pairs sharing B (SharedBTilesPastM). Stop 26 found 48
#    racecheck hazards in the pairs sharing A and the 2x2 blocks, all between the scale loader's writes and the
#    consumers' reads of a stage.
# 2. Where our 128x128:1c2 (cuBLASLt's exact tiling: 128x128x128, 6 stages, 2x1 cluster; 1348 vs ~1000 TFLOP/s at
#    M = 4096 N = 7168 K = 16384) loses: one accumulator set (cuBLASLt's loop) vs two, pingpong off, and no promotion
#    at all (channel-token with FINEGEMM_GEMM_FP32_ACCUM=0: no scale loaders, no FMAs), at the two M = 4096 bar shapes.
# 3. ncu of the no-promotion 128x128:1c2 kernel: does it also retry its full-barrier waits ~once per K block?
# Before 2: the A scales by one bulk copy per stage (FINEGEMM_GEMM_SCALE_BULK=1, stop 26, never run): its test, then
# timed against the loaders' gathers. In 2, also FINEGEMM_GEMM_HOIST_SPLIT=1 (stop 26, never run; its test first).
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
run() {  # name m n:k variant envs [timeout]
  FINEGEMM_PRINT_CONFIG=1 timeout ${6:-90} $B/bench/bench_cuda_linear --m $2 --nk $3 --variants $4 --envs "$5" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 $4 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*' $W/$1.err | sort | uniq | tr '\n' '|')"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-60s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/$1.txt
}
before() { [ $(( $(date +%s) - s0 )) -lt $1 ] || { echo "skipped (past $1 s): $*"; return 1; }; }
timeout 120 $B/tests/test_cuda_linear --gtest_filter='CudaTest.BulkScaleCopiesSameBits:CudaTest.HoistedSplitSameBits:CudaTest.SharedBTilesPastM' >$W/test_bulk.txt 2>&1
echo "bulk scale / hoisted split / pairs-B tests rc=$? $(grep -E '^\[ +(OK|FAILED) ' $W/test_bulk.txt | awk '{print $2,$4,$5,$6}' | tr '\n' ' ')"; grep -A3 Failure $W/test_bulk.txt | head
OUT=$W/san GPU_CHECK_DEADLINE=180 scripts/gpu-check sanitize 2>&1 | tail -16
C=FINEGEMM_GEMM_CONFIG=128x128:1c2
N=FINEGEMM_GEMM_FP32_ACCUM=0  # per-channel x per-token without the FP32 promotion past K = 4096: no promotion at all
H=FINEGEMM_GEMM_HOIST_SPLIT=1  # the K loop compiled for one B scale per tile (stop 26, never run)
E=";$H;$C;$C,$H;$C,FINEGEMM_GEMM_DOUBLE_ACC=0;$C,FINEGEMM_GEMM_DOUBLE_ACC=0,FINEGEMM_GEMM_PINGPONG=0;FINEGEMM_GEMM_CONFIG=128x128:1"
# The A scales by one bulk copy per stage (FINEGEMM_GEMM_SCALE_BULK=1; BF16 input, so that linear() quantizes them
# M-major; both rows time the quantization too).
BULK='FINEGEMM_GEMM_SCALE_BULK=0;FINEGEMM_GEMM_SCALE_BULK=1;FINEGEMM_GEMM_SCALE_BULK=1,FINEGEMM_GEMM_CONFIG=128x128:1c2'
for nk in 7168:16384 4096:7168 24576:1536; do
  before 300 && FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --bf16-input --m 4096 --nk $nk --envs "$BULK" \
    >$W/bulk_${nk/:/_}.txt 2>$W/bulk_${nk/:/_}.err
  echo "== bulk M=4096 $nk rc=$?"; python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-60s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/bulk_${nk/:/_}.txt
done
for nk in 7168:16384 4096:7168; do
  before 380 && run acc_${nk/:/_} 4096 $nk block-fp32-dynamic "$E"
  before 380 && run nopro_${nk/:/_} 4096 $nk channel-token "$N;$N,$C;$N,FINEGEMM_GEMM_CONFIG=128x128:1"
done
M='--metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed'
if before 420; then
  FINEGEMM_GEMM_FP32_ACCUM=0 FINEGEMM_GEMM_CONFIG=128x128:1c2 timeout 100 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f \
    -o $W/nopro128c2 --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no $M \
    $B/bench/bench_cuda_linear --m 4096 --nk 7168:16384 --variants channel-token >$W/nopro128c2.log 2>&1
  ncu -i $W/nopro128c2.ncu-rep --page source --print-source sass --csv >$W/nopro128c2_sass.csv 2>&1
  python3 scripts/sass-stalls $W/nopro128c2_sass.csv --top 30 | head -34
  ncu -i $W/nopro128c2.ncu-rep --page details 2>&1 | grep -E "Duration|pipe_shared|inst_executed|cycles_elapsed|Warp Cycles Per Issued"
  rm -f $W/nopro128c2.ncu-rep
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
