#!/usr/bin/env python3
"""bench/linear: finegemm FP8 linear vs cuBLASLt block-scaled FP8 (torch scaled_mm 1x128 x 128x128) and bf16
torch.matmul, on the DeepSeek-V3 reference shapes, in one run on one GPU, with one timing method (CUDA events
around single launches, median, and CUDA-graph replay, for every M unless --graph-max-m; weights rotated among copies
> 3x L2). Each side is compared at the better of its two times.
NOTE: events around a single launch on an idle stream also time the host's launch work (tens of µs for torch's
scaled_mm), so until stop 25, when only M <= 128 were replayed, the M = 512 rows flattered finegemm.

Usage: python3 bench/linear.py --bench build/bench/bench_cuda_linear [--out FILE.json] [--m 1,16,...] [--variants ...]
"""
import argparse, datetime, json, math, os, subprocess, sys, time

import torch
import torch.nn.functional as F

SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (576, 7168)]


def timed(fn, iters, graph_calls=None):
    """Median µs of single launches (events); with graph_calls, also µs per call of a replayed graph."""
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(5):
        fn(i)
    times = []
    for i in range(iters):
        s0.record(); fn(i); s1.record(); s1.synchronize()
        times.append(s0.elapsed_time(s1) * 1e3)
    times.sort()
    us = times[len(times) // 2]
    us_graph = 0.0
    if graph_calls:
        g = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for i in range(graph_calls):  # warm the allocator for capture
                fn(i)
            with torch.cuda.graph(g, stream=st):
                for i in range(graph_calls):
                    fn(i)
        torch.cuda.current_stream().wait_stream(st)
        g.replay(); torch.cuda.synchronize()
        gt = []
        for _ in range(20):
            s0.record(); g.replay(); s1.record(); s1.synchronize()
            gt.append(s0.elapsed_time(s1) * 1e3 / graph_calls)
        gt.sort()
        us_graph = gt[len(gt) // 2]
    return us, us_graph


def torch_baselines(ms, l2_bytes, shapes=SHAPES, graph_max_m=1 << 62):
    rows = []
    dev = "cuda"
    for n, k in shapes:
        copies = max(1, min(64, (3 * l2_bytes) // (n * k) + 2))
        w_q = [torch.randn(n, k, device=dev).mul(64).clamp(-448, 448).to(torch.float8_e4m3fn) for _ in range(copies)]
        L = k // 128; L4 = (L + 3) // 4 * 4
        w_s = torch.rand((n + 127) // 128, L, device=dev) * 1.5 / 256 + 0.5 / 256
        sb = F.pad(w_s, (0, L4 - L)).t()  # (L4, N/128), strides (1, L4)
        w_bf = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(max(1, min(copies, (3 * l2_bytes) // (2 * n * k) + 2)))]
        for m in ms:
            mp = (m + 3) // 4 * 4  # cuBLASLt needs M % 4 == 0: pad as vLLM does
            x_q = torch.randn(mp, k, device=dev).mul(64).clamp(-448, 448).to(torch.float8_e4m3fn)
            x_s = torch.rand(mp, L, device=dev) / 256 + 0.5 / 256
            sa = x_s.t().contiguous().t()
            def cublas(i):
                return F.scaled_mm(x_q, w_q[i % copies].t(), sa, F.ScalingType.BlockWise1x128, sb,
                                   F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)
            x_bf = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            def bf16(i):
                return x_bf @ w_bf[i % len(w_bf)].t()
            # Correctness of the baseline against a dequantized fp32 reference (sampled rows).
            out = cublas(0)
            rows_idx = torch.arange(0, m, max(1, m // 4), device=dev)[:4]
            xd = x_q[rows_idx].float() * x_s[rows_idx].repeat_interleave(128, 1)[:, :k]
            wd = w_q[0].float() * w_s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            ref = xd @ wd.t()
            rel = ((out[rows_idx].float() - ref).norm() / ref.norm()).item()
            iters = 30 if m >= 4096 else 100
            us_c, g_c = timed(cublas, iters, copies if m <= graph_max_m else None)
            us_b, g_b = timed(bf16, iters, len(w_bf) if m <= graph_max_m else None)
            rows.append(dict(m=m, n=n, k=k, cublas_us=us_c, cublas_us_graph=g_c, cublas_rel_err=rel,
                             bf16_us=us_b, bf16_us_graph=g_b))
            print(f"torch m={m} n={n} k={k} cublas {us_c:.1f}us (graph {g_c:.1f}) bf16 {us_b:.1f}us rel {rel:.2e}",
                  file=sys.stderr, flush=True)
        del w_q, w_bf
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="1,16,64,128,512,4096")
    ap.add_argument("--variants", default="block-fp32-dynamic,block-ue8m0-dynamic,block-fp32-static")
    ap.add_argument("--budget-s", type=float, default=0, help="stop the finegemm bench after 60%% of this many seconds")
    ap.add_argument("--row-major-scales", action="store_true",
                    help="give finegemm row-major activation group scales (default: M-major, the layout cuBLASLt "
                         "takes them in here: sa = x_s.t().contiguous().t())")
    ap.add_argument("--graph-max-m", type=int, default=1 << 62,
                    help="graph replay up to this M (default: every M; stop 24's tables used 128)")
    ap.add_argument("--nk", default=None,
                    help="only these (N, K) shapes, e.g. 32768:512,4096:7168 (default: the seven of RECIPES.md)")
    ap.add_argument("--weights-static", action="store_true",
                    help="pass RunOptions::weights_static to finegemm (the serving promise: the kernel ahead of a "
                         "call does not write its weights, so a decode call requests its first weight tiles before "
                         "it waits); cuBLASLt's rows are the same either way")
    ap.add_argument("--envs", default=None,
                    help="finegemm's bench runs each configuration once per environment in this ';' list "
                         "(e.g. ';FINEGEMM_GEMM_LEAN_PAIR=a', the first empty: the defaults), each row compared "
                         "with the same cuBLASLt time")
    args = ap.parse_args()
    ms = [int(v) for v in args.m.split(",")]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 60 * 2**20)

    # finegemm's rows stream in as the bench binary prints them; past --budget-s (a share of the caller's time) the
    # binary is stopped and the shapes it finished are compared, so that a long run still returns its results.
    # NOTE: a run that captured the binary's output to the end lost everything to the caller's timeout.
    t_start = time.monotonic()
    cmd = [args.bench, "--m", args.m, "--variants", args.variants, "--graph-max-m", str(args.graph_max_m)]
    if not args.row_major_scales:
        cmd.append("--m-major-scales")
    if args.nk:
        cmd += ["--nk", args.nk]
    if args.envs is not None:
        cmd += ["--envs", args.envs]
    if args.weights_static:
        cmd.append("--weights-static")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    ours = []
    stopped = False
    for line in proc.stdout:
        if line.startswith("{"):
            ours.append(json.loads(line))
            print(line.rstrip(), file=sys.stderr, flush=True)
        if args.budget_s and time.monotonic() - t_start > args.budget_s * 0.6:
            proc.kill()
            stopped = True
            break
    rc = proc.wait()
    if rc != 0 and not stopped:
        sys.exit(f"bench failed: {rc}")
    if stopped:
        print(f"bench stopped after {time.monotonic() - t_start:.0f} s with {len(ours)} rows (--budget-s {args.budget_s})",
              file=sys.stderr, flush=True)
    done_shapes = sorted({(r["n"], r["k"]) for r in ours}, key=lambda s: SHAPES.index(s) if s in SHAPES else len(SHAPES))
    base = {(r["m"], r["n"], r["k"]): r for r in torch_baselines(sorted({r["m"] for r in ours}), l2, done_shapes, args.graph_max_m)}

    def best(us, g):
        return min(us, g) if g > 0 else us

    rows = []
    for r in ours:
        b = base.get((r["m"], r["n"], r["k"]))
        if b is None:
            continue
        ours_t = best(r["us"], r["us_graph"])
        cub_t = best(b["cublas_us"], b["cublas_us_graph"])
        rows.append({**r, **b, "speedup_vs_cublas": cub_t / ours_t, "speedup_vs_bf16": best(b["bf16_us"], b["bf16_us_graph"]) / ours_t,
                     "weight_tbps": r["n"] * r["k"] * (0.5 if r["variant"].startswith("mxfp4") else 1.0) / ours_t / 1e6})
    print(f"{'variant':22s} {'M':>5s} {'N':>6s} {'K':>6s} {'us':>9s} {'graph':>8s} {'TFLOPS':>7s} {'W TB/s':>7s} "
          f"{'cuBLAS':>8s} {'x cuBLAS':>8s} {'bf16':>8s} {'rel':>8s}  env")
    for r in rows:
        print(f"{r['variant']:22s} {r['m']:5d} {r['n']:6d} {r['k']:6d} {r['us']:9.1f} {r['us_graph']:8.1f} {r['tflops']:7.0f} "
              f"{r['weight_tbps']:7.2f} {best(r['cublas_us'], r['cublas_us_graph']):8.1f} {r['speedup_vs_cublas']:8.2f} "
              f"{best(r['bf16_us'], r['bf16_us_graph']):8.1f} {r['rel_err']:8.1e}  {r.get('env') or 'default'}")
    for v, e in sorted({(r["variant"], r.get("env") or "") for r in rows}):
        sel = [r["speedup_vs_cublas"] for r in rows if r["variant"] == v and (r.get("env") or "") == e]
        gm = math.exp(sum(math.log(s) for s in sel) / len(sel))
        print(f"geomean speedup vs cuBLASLt [{v}{' ' + e if e else ''}] over {len(sel)} shapes: {gm:.3f}  (min {min(sel):.2f})")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "gpu": torch.cuda.get_device_name(0), "driver": torch.version.cuda,
        "commit": os.environ.get("FINEGEMM_COMMIT", "unknown"),
        "command": " ".join(sys.argv), "timing": f"CUDA events around single launches (median) and graph replay for M <= {args.graph_max_m}, each side at the better; weights rotated > 3x L2", "activation_scales": "row-major" if args.row_major_scales else "M-major (both sides)",
        "complete": not stopped,
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
