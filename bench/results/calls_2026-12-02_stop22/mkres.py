import json,re,glob
def dec_rows(path):
    out=[]
    for l in open(path):
        m=re.match(r'fp4 decode (\S+) M=(\d+) N=(\d+) K=(\d+) -> (.*?) :: (.*)',l.strip())
        if not m: continue
        cfg,M,N,K,conf,res=m.groups()
        r={'config':cfg,'M':int(M),'N':int(N),'K':int(K),'launch':conf}
        for k,v in re.findall(r'"(\w+)": ([-0-9.e]+)',res): r[k]=float(v)
        out.append(r)
    return out
def ab_rows(txt):
    out=[]
    for l in txt.split('\n'):
        m=re.match(r'ab (old|new) rep(\d) M=(\d+) N=(\d+) K=(\d+) -> (\S+) :: (.*)',l.strip())
        if not m: continue
        v,rep,M,N,K,cfg,res=m.groups()
        r={'binary':v,'rep':int(rep),'M':int(M),'N':int(N),'K':int(K),'tile':cfg}
        for k,val in re.findall(r'"(\w+)": ([-0-9.e]+)',res): r[k]=float(val)
        out.append(r)
    return out
def moe(path):
    return [json.loads(l) for l in open(path) if l.startswith('{')]
c1='/tmp/c1x'
d1={'date':'2026-12-02','gpu':'NVIDIA H200 (sm_90a)','commit':'0a08a2b',
 'command':'bench/results/calls_2026-12-02_stop22/call1.sh: gpu-check test (test_cuda_fp4, test_cuda_linear x3 shards, test_cuda_moe, test_cuda_capture_first); bench_cuda_moe --layers deepseek-v3 --tokens 4096 --recipes dynamic,fp4 --check-tokens 8, and with FINEGEMM_FP4_EXPAND_GROUPED_ROWS=64 (fp4); [WEIGHTS_STATIC=1] FP4_DECODE_SHAPES=... FP4_DECODE_CONFIGS="fp8:heuristic" gpu-check bench-fp4-decode; FP4_DECODE_CONFIGS="fp8:heuristic fp8:2 fp8:3 fp8:4 fp8:6 fp8:8" at N=4096 K=7168',
 'note':'Stop 21 code on the GPU for the first time: all suites pass except CudaMoe.PerTokenActivationsOnTheGpuPath (switch off by default; 1.04e-2 against its 1e-2 bar at T=1, the known intermediate-requantization flip). FP4 MoE with expanded experts (FINEGEMM_FP4_EXPAND_GROUPED_ROWS=64): 15.28 ms vs 16.50 in-kernel, FP8 8.32 ms. weights_static (E4M3 inputs): N=24576 K=1536 M=1 12.01 us graph (3.15 TB/s) vs 13.20 without; M=16 13.22 vs 14.48. Decode split at N=4096 K=7168: 3-4 beat the heuristic 6.',
 'tests':open(f'{c1}/t/summary.txt').read().strip().split('\n'),
 'moe':moe(f'{c1}/w/moe.jsonl'),'moe_fp4_expanded_experts':moe(f'{c1}/w/moe_grouped.jsonl'),
 'decode_default':dec_rows(f'{c1}/d1/summary.txt'),'decode_weights_static':dec_rows(f'{c1}/d2/summary.txt'),'decode_split_4096x7168':dec_rows(f'{c1}/d3/summary.txt')}
json.dump(d1,open('/work/main/bench/results/stop22_verify_2026-12-02_0a08a2b.json','w'),indent=1)
# call 2
c2='/tmp/c2'
d2={'date':'2026-12-02','gpu':'NVIDIA H200 (sm_90a)','commit':'0a08a2b',
 'command':'bench/results/calls_2026-12-02_stop22/call2.sh: FP4_DECODE_SHAPES="1:2112:7168 64:2112:7168 1:7168:2048 64:7168:2048 64:7168:16384" FP4_DECODE_CONFIGS="fp8:heuristic fp8:1 fp8:2 fp8:4 fp8:8" gpu-check bench-fp4-decode; ncu --metrics gpu__time_duration.sum -c 40 bench_cuda_linear --m 4096 --nk 4096:7168 --variants mxfp4-group128|block-fp32-dynamic --quick; PROFILE_KERNEL=sm90_fp8_gemm PROFILE_SHAPES=4096:7168:16384 gpu-check profile',
 'note':'FP4 prefill at M=4096 N=4096 K=7168 per kernel (ncu, us): scan 6.7-7.0, expansion 23.1-24.3, E4M3 GEMM 369-376 (FP8 alone 371-378), the two gated GEMM launches that exit 2.5-3.1 each. Prefill profile (192x128 tiles, 5 stages, 1.03 ms under ncu): issue-bound, one instruction per 2.1 cycles per scheduler; 407.6 M warp instructions: FFMA 28.8%, IMAD 19.9%, R2UR 7.7%; a consumer warp ran 179 instructions per K block (64 FFMA, 4 QGMMA, ~80 rebuilding descriptors and barrier addresses from generic pointers); the scale-loader warps ~318 per K block each. L2 hit 82%, DRAM 16%.',
 'decode_splits':dec_rows(f'{c2}/d/summary.txt'),
 'fp4_prefill_kernels_us':{'fold_scan':[6.69,7.01],'expand':[23.10,24.26],'e4m3_gemm':[369.3,375.7],'gated_exits':[2.46,3.10],'fp8_gemm_alone':[370.9,378.6]}}
json.dump(d2,open('/work/main/bench/results/stop22_profile_2026-12-02_0a08a2b.json','w'),indent=1)
