#!/usr/bin/env python3
"""What cuBLASLt runs for block-scaled FP8 (torch scaled_mm 1x128 x 128x128): the kernel names and device times of each
shape, from torch.profiler, so that finegemm's tile, cluster and schedule choices can be compared with the baseline's.
Under Nsight Compute, --iters 1 --no-profile runs each shape once after a warm-up:
  python3 bench/cublas_probe.py --shapes 4096:7168:16384,512:7168:16384
  ncu --kernel-name regex:'sm90|cutlass|gemm' --launch-skip 1 -c 1 python3 bench/cublas_probe.py --shapes ... --no-profile
"""
import argparse

import torch
import torch.nn.functional as F


def make(m, n, k):
    dev = "cuda"
    L = k // 128
    L4 = (L + 3) // 4 * 4
    w_q = torch.randn(n, k, device=dev).mul(64).clamp(-448, 448).to(torch.float8_e4m3fn)
    w_s = torch.rand((n + 127) // 128, L, device=dev) / 256 + 0.5 / 256
    sb = F.pad(w_s, (0, L4 - L)).t()
    x_q = torch.randn(m, k, device=dev).mul(64).clamp(-448, 448).to(torch.float8_e4m3fn)
    sa = (torch.rand(m, L, device=dev) / 256 + 0.5 / 256).t().contiguous().t()
    return lambda: F.scaled_mm(x_q, w_q.t(), sa, F.ScalingType.BlockWise1x128, sb, F.ScalingType.BlockWise128x128,
                               output_dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True, help="M:N:K,...")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    for s in args.shapes.split(","):
        m, n, k = (int(v) for v in s.split(":"))
        fn = make(m, n, k)
        fn()
        torch.cuda.synchronize()
        if args.no_profile:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us = e.device_time_total / max(1, e.count)
                tflops = 2.0 * m * n * k / us / 1e6
                print(f"M={m} N={n} K={k} {us:9.1f} us ({tflops:6.0f} TFLOP/s) x{e.count} {e.key}", flush=True)


if __name__ == "__main__":
    main()
