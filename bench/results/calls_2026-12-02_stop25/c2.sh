cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
run() {
  FINEGEMM_PRINT_CONFIG=1 timeout 90 $B/bench/bench_cuda_linear --m $2 --nk $3 --variants $4 --envs "$5" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 $4 rc=$? ($(( $(date +%s) - s0 )) s)"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-70s us=%8.2f graph=%7.2f tflops=%7.1f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["tflops"], r["rel_err"]))
' $W/$1.txt
}
V=block-fp32-dynamic
E='FINEGEMM_GEMM_WIDE_STORES=1;FINEGEMM_GEMM_WIDE_STORES=1,FINEGEMM_GEMM_CONFIG=192x128:1c2a;FINEGEMM_GEMM_WIDE_STORES=1,FINEGEMM_GEMM_CONFIG=192x128;FINEGEMM_GEMM_WIDE_STORES=1,FINEGEMM_GEMM_CONFIG=128x128'
for nk in 7168:16384 4096:7168 2048:7168 24576:1536; do run w_${nk/:/_} 4096 $nk $V "$E"; done
run ct 4096 7168:16384 channel-token "$E"
for bm in 192; do
  FINEGEMM_GEMM_WIDE_STORES=1 FINEGEMM_GROUPED_BLOCK_M=$bm timeout 60 $B/bench/bench_cuda_moe --layers deepseek-v3,qwen3-30b-a3b --tokens 4096,16384 --recipes dynamic --check-tokens 4 >$W/moe_bm$bm.jsonl 2>$W/moe_bm$bm.err
  echo "moe wide block_m=$bm rc=$? :: $(grep -o '"layer": "[a-z0-9-]*"\|"T": [0-9]*\|"layer_us": [0-9.]*\|"gemm_tflops": [0-9.]*\|"check": "[a-z]*"' $W/moe_bm$bm.jsonl | tr '\n' ' ')"
done
cd $OUT && tar czf all.tgz w && rm -rf w; echo "total $(( $(date +%s) - s0 )) s"
