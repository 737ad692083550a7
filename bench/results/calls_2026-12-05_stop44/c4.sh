#!/usr/bin/env bash
# Stop 44, call 4 (stop 43's c4.sh; carry [".snap/prebuilt.txz", ".snap/c4.sh"]; <= 560 s): the racecheck half of
# `gpu-check sanitize` that stop 43's call 3 ran out of time for (grouped lean, the permuted FP4 decode, both split
# finishes, the ring probes, FP4 fold, FP4 lean, MoE), SANITIZE_TOOLS=racecheck (stop 43), from the repository root.
cd "$(dirname "$0")/.."
mkdir -p .snap/.prebuilt && tar xJf .snap/prebuilt.txz -C .snap/.prebuilt; export FINEGEMM_PREBUILT=.snap/.prebuilt
s0=$(date +%s); W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$W/san SANITIZE_TOOLS=racecheck GPU_CHECK_DEADLINE=540 timeout 550 scripts/gpu-check sanitize >$W/san.log 2>&1
echo "rc=$? ($(( $(date +%s) - s0 )) s)"; grep -E "compute-sanitizer" $W/san.log | tail -30
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
