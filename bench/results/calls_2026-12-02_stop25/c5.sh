cd "$(dirname "$0")"
mkdir -p .prebuilt && tar xJf prebuilt.txz -C .prebuilt; export FINEGEMM_PREBUILT=.prebuilt
B=.prebuilt; s0=$(date +%s); W=$OUT/w; mkdir -p $W
run() {
  FINEGEMM_PRINT_CONFIG=1 timeout 60 $B/bench/bench_cuda_linear --m $2 --nk $3 --variants block-fp32-dynamic --envs "$4" >$W/$1.txt 2>$W/$1.err
  echo "== $1 M=$2 $3 rc=$? ($(( $(date +%s) - s0 )) s) $(grep -o -- '-> .*' $W/$1.err | sort | uniq | tr '\n' '|')"
  python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print("  env=%-50s us=%8.2f graph=%7.2f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["rel_err"]))
' $W/$1.txt
}
run a 64 7168:2048 ';FINEGEMM_FP8_DECODE=1;FINEGEMM_GEMM_CONFIG=64x128;FINEGEMM_GEMM_CONFIG=64x64:4;FINEGEMM_GEMM_CONFIG=64x64:2;FINEGEMM_GEMM_CONFIG=64x128:2'
run b 128 32768:512 ';FINEGEMM_GEMM_CONFIG=128x192;FINEGEMM_GEMM_CONFIG=128x128:1c2;FINEGEMM_GEMM_CONFIG=64x128;FINEGEMM_GEMM_CONFIG=128x64'
run c 128 24576:1536 ';FINEGEMM_GEMM_CONFIG=128x192;FINEGEMM_GEMM_CONFIG=128x64;FINEGEMM_GEMM_CONFIG=128x128:1c2;FINEGEMM_GEMM_CONFIG=64x128'
run d 16 32768:512 ';FINEGEMM_FP8_DECODE=0'
run e 128 7168:2048 ';FINEGEMM_GEMM_CONFIG=128x64:2;FINEGEMM_GEMM_CONFIG=128x128:2;FINEGEMM_FP8_DECODE=1'
echo "total $(( $(date +%s) - s0 )) s"
