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
        r = json.loads(l); print("  env=%-40s us=%8.2f graph=%7.2f rel=%.2e" % (r["env"] or "default", r["us"], r["us_graph"], r["rel_err"]))
' $W/$1.txt
}
run m64 64 7168:2048 ';FINEGEMM_GEMM_CONFIG=64x128:2;FINEGEMM_GEMM_CONFIG=64x64:8'
run m48 48 7168:2048 ';FINEGEMM_GEMM_CONFIG=64x64:8'
run m16 16 32768:512 ';FINEGEMM_FP8_DECODE=1'
run m8 8 32768:512 ';FINEGEMM_FP8_DECODE=0'
run m32 32 32768:512 ';FINEGEMM_FP8_DECODE=1'
timeout 190 $B/tests/test_cuda_linear --gtest_filter='-*Pingpong*:*DoubleAcc*' >$W/test_lin.txt 2>&1
echo "linear tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $W/test_lin.txt | tr '\n' ' ') $(grep -c '^\[       OK' $W/test_lin.txt) ok ($(( $(date +%s) - s0 )) s)"; grep -E "Failure" -A3 $W/test_lin.txt | head -10; grep FAILED $W/test_lin.txt | head
left=$(( 440 - $(date +%s) + s0 ))
timeout $left python3 bench/linear.py --bench $B/bench/bench_cuda_linear --m 1,16,64,128,512,4096 --variants block-fp32-dynamic \
    --budget-s $(( left - 15 )) --out "$W/linear_$(date -u +%Y-%m-%d).json" >$W/bench_linear.txt 2>$W/bench_linear.err
echo "linear rc=$? ($(( $(date +%s) - s0 )) s)"; tail -45 $W/bench_linear.txt; tail -3 $W/bench_linear.err
cd $OUT && tar czf all.tgz w && rm -rf w
echo "total $(( $(date +%s) - s0 )) s"
