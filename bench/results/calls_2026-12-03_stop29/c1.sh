#!/usr/bin/env bash
# Stop 29 call 1: (a) M = 512, the seven (N, K): multicast clusters (128x128 and 192x128 tiles, pairs sharing B or A,
# 2x2 blocks) against the heuristic, same data, graph replay: is the one-wave M = 512 GEMM bound by the L2 feed
# (32 KB per 128x128 tile and K block unclustered)? (b) ncu of the default M = 512 N = 4096 K = 7168 (L2 and xbar
# bytes). (c) bench/linear, the 42 shapes with stop 28's M = 128 pick.
cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
show() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-34s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % ((r["env"] or "default").replace("FINEGEMM_GEMM_CONFIG=","cfg="), r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $1; }
T=FINEGEMM_GEMM_CONFIG
for nk in 4096:7168 7168:16384 24576:1536 32768:512 7168:2048 2112:7168 576:7168; do
  [ $(( $(date +%s) - s0 )) -lt 200 ] || { echo "skipped M=512 $nk"; continue; }
  E=";$T=128x128:1c2;$T=128x128:1c2a;$T=128x128:1c4;$T=192x128:1c2;$T=192x128:1c2a;$T=192x128:1c4"
  FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m-major-scales --m 512 --nk $nk --variants block-fp32-dynamic --envs "$E" >$W/s_512_${nk/:/_}.txt 2>$W/s_512_${nk/:/_}.err
  echo "== M=512 $nk rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> [0-9x]* [^g]*' $W/s_512_${nk/:/_}.err | head -1)"; show $W/s_512_${nk/:/_}.txt
done
M='--metrics sm__cycles_elapsed.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,lts__t_sectors_srcunit_tex.sum,smsp__inst_executed.sum'
timeout 60 ncu --clock-control none -k regex:sm90_fp8_gemm --launch-skip 3 --launch-count 1 -f -o $W/n512 --section SpeedOfLight --section MemoryWorkloadAnalysis $M \
  $B/bench/bench_cuda_linear --m-major-scales --m 512 --nk 4096:7168 --variants block-fp32-dynamic >$W/n512.log 2>&1
echo "== ncu M=512 rc=$? ($(( $(date +%s) - s0 )) s)"
ncu -i $W/n512.ncu-rep --page details >$W/n512.txt 2>&1; rm -f $W/n512.ncu-rep
grep -E "Duration|SM Frequency|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Compute \(SM\)|gmma|lts__t_bytes|dram__bytes|xbar2l1tex|Mem Busy|Max Bandwidth" $W/n512.txt | head -20
echo "== bench/linear 42 shapes ($(( $(date +%s) - s0 )) s)"
timeout $(( 575 - ($(date +%s) - s0) )) python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic --out $W/linear42.json >$W/linear42.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; tail -60 $W/linear42.log
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
