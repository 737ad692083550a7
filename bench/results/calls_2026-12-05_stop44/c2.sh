#!/usr/bin/env bash
# Stop 44, call 2 (stop 43's c2.sh; carry [".snap/prebuilt.txz", ".snap/c2.sh"] after scripts/pack-prebuilt; <= 560 s):
# issue 3's 42-shape table against cuBLASLt (bench/linear.py through `gpu-check bench`, block-fp32-dynamic, every M,
# graph replay), not run since stop 39; stop 40's cost model moved M = 4096 N = 32768 K = 512 to 192-row tiles. Then,
# with the time left, the static and UE8M0 recipes at M = 512 and 4096 on N = 7168 K = 16384 (issue 3: static no
# slower than dynamic, UE8M0 as fast as FP32 scales).
cd "$(dirname "$0")/.."
mkdir -p .snap/.prebuilt && tar xJf .snap/prebuilt.txz -C .snap/.prebuilt; export FINEGEMM_PREBUILT=.snap/.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
el() { echo "($(( $(date +%s) - s0 )) s)"; }
nvidia-smi --query-gpu=name --format=csv,noheader
FINEGEMM_COMMIT=${C2_COMMIT:-unknown} OUT=$W/bench LINEAR_VARIANTS=block-fp32-dynamic LINEAR_BUDGET=420 GPU_CHECK_DEADLINE=450 \
  timeout 460 scripts/gpu-check bench >$W/bench.log 2>&1
echo "gpu-check bench rc=$? $(el)"; grep -E "geomean|variant|^block" $W/bench/bench_linear.txt 2>/dev/null | tail -50
if [ $(( $(date +%s) - s0 )) -lt 500 ]; then
  timeout 50 .snap/.prebuilt/bench/bench_cuda_linear --m-major-scales --m 512,4096 --nk 7168:16384 \
    --variants block-fp32-dynamic,block-fp32-static,block-ue8m0-dynamic >$W/recipes.jsonl 2>$W/recipes.err
  echo "-- recipes $(el)"; grep "^{" $W/recipes.jsonl | cut -c1-200
fi
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
