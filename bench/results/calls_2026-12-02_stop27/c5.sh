#!/usr/bin/env bash
# Stop 27 call 5: ncu of the new default M = 4096 N = 7168 K = 16384 kernel (192x128 pairs, hoisted split, bulk A
# scales, M-major scales): tensor pipe share, issue stalls by SASS line, for the next session's main-loop work.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
M='--metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed'
for cfg in default 128x128:1c2; do
  e=""; [ $cfg = default ] || e="FINEGEMM_GEMM_CONFIG=$cfg"
  env $e timeout 150 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f \
    -o $W/k_${cfg/:/_} --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no $M \
    $B/bench/bench_cuda_linear --m-major-scales --m 4096 --nk 7168:16384 --variants block-fp32-dynamic >$W/k_${cfg/:/_}.log 2>&1
  echo "== $cfg rc=$? ($(( $(date +%s) - s0 )) s)"
  ncu -i $W/k_${cfg/:/_}.ncu-rep --page source --print-source sass --csv >$W/k_${cfg/:/_}_sass.csv 2>&1
  python3 scripts/sass-stalls $W/k_${cfg/:/_}_sass.csv --top 16 | head -20
  ncu -i $W/k_${cfg/:/_}.ncu-rep --page details 2>&1 | grep -E "Duration|pipe_shared|gmma|inst_executed|cycles_elapsed|Warp Cycles Per Issued"
  rm -f $W/k_${cfg/:/_}.ncu-rep; gzip $W/k_${cfg/:/_}_sass.csv
done
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
