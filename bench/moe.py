#!/usr/bin/env python3
"""bench/moe: finegemm's MoE block (FP8 experts, block 128x128) vs what an eager framework does, on the MoE layers of
RECIPES.md (DeepSeek-V3, Qwen3-30B-A3B) at T in {1, 16, 128, 1024, 4096, 16384}, in one run on one GPU.

Baselines (torch, same layer shapes, random FP8 weights, random top-k routing, CUDA events, median):
  eager:      torch routing (sort by expert, one host sync for the counts), per-expert loop of cuBLASLt block-scaled FP8
              GEMMs (F.scaled_mm, BlockWise1x128 activations quantized by torch ops per token group, BlockWise128x128
              weights, M padded to 4), silu(gate)*up in torch, requantization in torch, down GEMM, weighted index_add.
  grouped_mm: bf16 torch._grouped_mm on the dequantized weights (no activation quantization), where it runs.
finegemm's side comes from bench_cuda_moe (--bench), which checks every configuration against the CPU reference first.

Usage: python3 bench/moe.py --bench build/bench/bench_cuda_moe [--out FILE.json] [--layers ...] [--tokens 1,16,...]
       [--recipes dynamic,static,ue8m0] [--ours FILE.jsonl (skip running the bench: use its saved output)]
"""
import argparse, datetime, json, os, subprocess, sys, time

import torch
import torch.nn.functional as F

LAYERS = {  # name: (H, I, E, top_k)
    "deepseek-v3": (7168, 2048, 256, 8),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
}
BW1x128 = F.ScalingType.BlockWise1x128
BW128 = F.ScalingType.BlockWise128x128
DEV = "cuda"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def iters_for(t):
    return 20 if t <= 128 else 10 if t <= 1024 else 5


def time_events(fn, n_inputs, iters, warmup=2):
    """Median µs of single calls, events around each; call i uses input i % n_inputs."""
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(warmup):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        s0.record(); fn(i % n_inputs); s1.record(); s1.synchronize()
        times.append(s0.elapsed_time(s1) * 1e3)
    times.sort()
    return times[len(times) // 2]


def quant_group(x):
    """Dynamic 1x128 quantization in torch ops: (q [M, K] e4m3, s [M, K/128] fp32 dequant scales)."""
    m, k = x.shape
    xf = x.float().view(m, k // 128, 128)
    s = xf.abs().amax(-1).clamp(min=1e-4) / 448.0
    q = (xf / s.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(m, k)
    return q, s


def dequant_weight(w_q, w_s):
    n, k = w_q.shape
    return w_q.float() * w_s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


class Experts:
    """Random FP8 experts of one layer (allocated once, reused across T), with the cuBLASLt weight scales padded once."""

    def __init__(self, h, i, e):
        self.H, self.I, self.E = h, i, e
        self.w_gu = torch.empty(e, 2 * i, h, device=DEV, dtype=torch.float8_e4m3fn)
        self.w_dn = torch.empty(e, h, i, device=DEV, dtype=torch.float8_e4m3fn)
        for x in range(e):  # N(0, 64²) E4M3 values, one expert at a time (no 30 GB float temporary)
            self.w_gu[x] = torch.randn(2 * i, h, device=DEV).mul_(64).clamp_(-448, 448).to(torch.float8_e4m3fn)
            self.w_dn[x] = torch.randn(h, i, device=DEV).mul_(64).clamp_(-448, 448).to(torch.float8_e4m3fn)
        # |w| ~ 1/sqrt(K), as bench_cuda_moe does.
        self.s_gu = (torch.rand(e, 2 * i // 128, h // 128, device=DEV) * 1.5 + 0.5) / (64 * h ** 0.5)
        self.s_dn = (torch.rand(e, h // 128, i // 128, device=DEV) * 1.5 + 0.5) / (64 * i ** 0.5)

        def padded(s):  # (L4, N/128), strides (1, L4), as BASELINES.md says
            L = s.shape[1]; L4 = (L + 3) // 4 * 4
            return F.pad(s, (0, L4 - L)).t()

        self.sb_gu = [padded(self.s_gu[x]) for x in range(e)]
        self.sb_dn = [padded(self.s_dn[x]) for x in range(e)]

    def bf16(self):
        gu = torch.empty(self.E, 2 * self.I, self.H, device=DEV, dtype=torch.bfloat16)
        dn = torch.empty(self.E, self.H, self.I, device=DEV, dtype=torch.bfloat16)
        for x in range(self.E):
            gu[x] = dequant_weight(self.w_gu[x], self.s_gu[x]).to(torch.bfloat16)
            dn[x] = dequant_weight(self.w_dn[x], self.s_dn[x]).to(torch.bfloat16)
        return gu, dn


def random_routing(t, e, k):
    idx = torch.rand(t, e, device=DEV).topk(k, dim=1).indices  # distinct experts per token
    w = torch.softmax(torch.randn(t, k, device=DEV), dim=1)
    return idx, w


def eager_moe(x, idx, wts, P):
    """What an eager framework does: sort by expert, per-expert cuBLASLt loop, torch activation/requant/combine."""
    T, H = x.shape
    k = idx.shape[1]
    E, I = P.E, P.I
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    counts = torch.bincount(flat, minlength=E)
    counts4 = (counts + 3) // 4 * 4  # cuBLASLt needs M % 4 == 0: pad each expert's rows (vLLM does the same)
    off = torch.cumsum(counts, 0) - counts
    off4 = torch.cumsum(counts4, 0) - counts4
    dest = off4[sorted_e] + torch.arange(flat.numel(), device=DEV) - off[sorted_e]
    c_host, c4_host = counts.tolist(), counts4.tolist()  # the host sync eager loops need
    token_sorted = order // k
    w_sorted = wts.reshape(-1)[order].float()
    src = torch.zeros(sum(c4_host), dtype=torch.long, device=DEV)  # padding rows read token 0, then are dropped
    src[dest] = token_sorted
    xq, xs = quant_group(x[src])
    out = torch.zeros(T, H, device=DEV, dtype=torch.float32)
    p = q = 0
    for e in range(E):
        c, c4 = c_host[e], c4_host[e]
        if c == 0:
            continue
        sa = xs[p:p + c4].t().contiguous().t()
        gu = F.scaled_mm(xq[p:p + c4], P.w_gu[e].t(), sa, BW1x128, P.sb_gu[e], BW128, output_dtype=torch.bfloat16)
        h = F.silu(gu[:, :I]) * gu[:, I:]
        hq, hs = quant_group(h)
        y = F.scaled_mm(hq, P.w_dn[e].t(), hs.t().contiguous().t(), BW1x128, P.sb_dn[e], BW128,
                        output_dtype=torch.bfloat16)
        out.index_add_(0, token_sorted[q:q + c], y[:c].float() * w_sorted[q:q + c, None])
        p += c4
        q += c
    return out.to(torch.bfloat16)


def grouped_moe(x, idx, wts, gu_t, dn_t, I):
    """bf16 torch._grouped_mm on dequantized weights (mat_b [E, K, N] views of the [E, N, K] weights)."""
    T, H = x.shape
    k = idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=gu_t.shape[0]), 0, dtype=torch.int32)
    token_sorted = order // k
    xs = x[token_sorted]
    g = torch._grouped_mm(xs, gu_t, offs=offs)
    h = F.silu(g[:, :I]) * g[:, I:]
    y = torch._grouped_mm(h, dn_t, offs=offs)
    out = torch.zeros(T, H, device=DEV, dtype=torch.float32)
    out.index_add_(0, token_sorted, y.float() * wts.reshape(-1)[order].float()[:, None])
    return out.to(torch.bfloat16)


def reference_rows(x, idx, wts, P, rows):
    """fp32 reference with the same activation and intermediate quantization as the recipe, on a few tokens."""
    I = P.I
    ref = []
    for t in rows:
        xq, xs = quant_group(x[t:t + 1])
        xd = xq.float() * xs.repeat_interleave(128, 1)
        acc = torch.zeros(1, P.H, device=DEV)
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            g = xd @ dequant_weight(P.w_gu[e], P.s_gu[e]).t()
            h = F.silu(g[:, :I]) * g[:, I:]
            hq, hs = quant_group(h)
            acc += float(wts[t, j]) * ((hq.float() * hs.repeat_interleave(128, 1)) @ dequant_weight(P.w_dn[e], P.s_dn[e]).t())
        ref.append(acc)
    return torch.cat(ref)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def torch_baselines(layers, tokens):
    rows = {}
    for name in layers:
        H, I, E, k = LAYERS[name]
        t0 = time.time()
        P = Experts(H, I, E)
        x_all = torch.randn(max(tokens), H, device=DEV, dtype=torch.bfloat16)
        routings = {}
        for T in tokens:
            n = 8 if T <= 128 else 1  # routings rotate for small T, as in bench_cuda_moe (L2)
            routings[T] = [random_routing(T, E, k) for _ in range(n)]
        log(f"torch {name}: FP8 experts ready in {time.time() - t0:.1f}s")
        outs = {}
        for T in tokens:
            x = x_all[:T]
            rs = routings[T]
            r = dict(layer=name, T=T)
            try:
                out = eager_moe(x, *rs[0], P)
                sample = sorted({0, T - 1, T // 2})
                r["eager_rel_err"] = rel(out[sample], reference_rows(x, *rs[0], P, sample))
                outs[T] = out
                r["eager_us"] = time_events(lambda i: eager_moe(x, *rs[i], P), len(rs), iters_for(T))
            except Exception as ex:  # report, keep going
                r["eager_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
            rows[(name, T)] = r
            log(f"torch {name} T={T} eager {r.get('eager_us', float('nan')):.1f}us "
                f"rel {r.get('eager_rel_err', float('nan')):.2e} {r.get('eager_error', '')}")
        # bf16 grouped_mm on dequantized weights (DeepSeek-V3: 22.5 GB), freed after the layer.
        try:
            gu, dn = P.bf16()
            gu_t, dn_t = gu.transpose(1, 2), dn.transpose(1, 2)
        except Exception as ex:
            gu = dn = None
            for T in tokens:
                rows[(name, T)]["grouped_mm_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        if gu is not None:
            for T in tokens:
                x = x_all[:T]
                rs = routings[T]
                r = rows[(name, T)]
                try:
                    out = grouped_moe(x, *rs[0], gu_t, dn_t, I)
                    if T in outs:
                        r["grouped_mm_vs_eager_rel"] = rel(out, outs[T])
                    r["grouped_mm_us"] = time_events(lambda i: grouped_moe(x, *rs[i], gu_t, dn_t, I), len(rs), iters_for(T))
                except Exception as ex:
                    r["grouped_mm_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
                log(f"torch {name} T={T} grouped_mm {r.get('grouped_mm_us', float('nan')):.1f}us "
                    f"{r.get('grouped_mm_error', '')}")
            del gu, dn, gu_t, dn_t
        del P, x_all, routings, outs
        torch.cuda.empty_cache()
    return rows


def fmt(v, spec, width):
    return f"{v:{width}{spec}}" if isinstance(v, (int, float)) and v == v else f"{'-':>{width}s}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path to bench_cuda_moe")
    ap.add_argument("--out", default=None)
    ap.add_argument("--layers", default="deepseek-v3,qwen3-30b-a3b")
    ap.add_argument("--tokens", default="1,16,128,1024,4096,16384")
    ap.add_argument("--recipes", default="dynamic")
    ap.add_argument("--ours", default=None, help="saved bench_cuda_moe output (JSON lines) instead of running it")
    args = ap.parse_args()
    layers = args.layers.split(",")
    tokens = [int(v) for v in args.tokens.split(",")]
    for name in layers:
        if name not in LAYERS:
            sys.exit(f"--layers: unknown layer {name!r} (expected one of {', '.join(LAYERS)})")

    t0 = time.time()
    bench_rc = 0
    if args.ours:
        with open(args.ours) as f:
            ours_text = f.read()
    else:
        cmd = [args.bench, "--layers", args.layers, "--tokens", args.tokens, "--recipes", args.recipes]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(proc.stderr)
        ours_text = proc.stdout
        bench_rc = proc.returncode
        if proc.returncode != 0:
            log(f"bench_cuda_moe exited with {proc.returncode} (failed checks are listed below; rows that passed are kept)")
    ours = [json.loads(l) for l in ours_text.splitlines() if l.startswith("{")]
    if not ours:
        print(ours_text)
        sys.exit("bench_cuda_moe printed no rows")
    log(f"bench_cuda_moe: {len(ours)} rows in {time.time() - t0:.0f}s")
    t1 = time.time()
    base = torch_baselines(layers, tokens)
    log(f"torch baselines in {time.time() - t1:.0f}s")

    rows, failed = [], []
    for r in ours:
        if r.get("check") != "ok":
            failed.append(r)
            continue
        b = base.get((r["layer"], r["T"]), {})
        row = {**r, **{k: v for k, v in b.items() if k not in ("layer", "T")}}
        if "eager_us" in b:
            row["speedup_vs_eager"] = b["eager_us"] / r["layer_us"]
            if r["layer_us_graph"] > 0:
                row["speedup_vs_eager_graph"] = b["eager_us"] / r["layer_us_graph"]
        if "grouped_mm_us" in b:
            row["speedup_vs_grouped_mm"] = b["grouped_mm_us"] / r["layer_us"]
        rows.append(row)

    print(f"{'layer':14s} {'variant':20s} {'T':>6s} {'layer us':>9s} {'graph':>8s} {'eager us':>9s} {'x eager':>7s} "
          f"{'grp_mm us':>9s} {'GEMM TF':>7s} {'W TB/s':>6s} {'route':>6s} {'perm':>6s} {'gate_up':>8s} {'down':>8s} "
          f"{'comb':>6s} {'rel':>8s}")
    for r in rows:
        tbps = r["weight_tbps"] if r["T"] <= 128 else float("nan")
        print(f"{r['layer']:14s} {r['variant']:20s} {r['T']:6d} {r['layer_us']:9.1f} {fmt(r['layer_us_graph'] or float('nan'), '.1f', 8)} "
              f"{fmt(r.get('eager_us', float('nan')), '.1f', 9)} {fmt(r.get('speedup_vs_eager', float('nan')), '.2f', 7)} "
              f"{fmt(r.get('grouped_mm_us', float('nan')), '.1f', 9)} {r['gemm_tflops']:7.0f} {fmt(tbps, '.2f', 6)} "
              f"{r['route_us']:6.1f} {r['permute_us']:6.1f} {r['gate_up_us']:8.1f} {r['down_us']:8.1f} "
              f"{r['combine_us']:6.1f} {fmt(r['rel_err'] if r['rel_err'] is not None else float('nan'), '.1e', 8)}")
    for r in rows:
        if not r.get("steps_match_layer", True):
            print(f"warning: {r['layer']} {r['variant']} T={r['T']}: the step sequence did not reproduce the layer bit for bit")
    for (name, T), b in sorted(base.items()):
        for key in ("eager_error", "grouped_mm_error"):
            if key in b:
                print(f"{name} T={T} {key}: {b[key]}")
    for r in failed:
        print(f"CHECK FAILED: {json.dumps(r)}")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda, "torch": torch.__version__,
        "commit": os.environ.get("FINEGEMM_COMMIT", "unknown"),
        "command": " ".join(sys.argv),
        "timing": "CUDA events around single calls (median after warm-up); finegemm also as CUDA-graph replay for T<=128 "
                  "(one graph of one call per routing); steps timed with events between the internal launches; "
                  "8 random routings rotated for T<=128 (both sides); finegemm's scratch from a cudaMallocAsync pool "
                  "that keeps its memory",
        "baselines": "eager: torch sort + per-expert F.scaled_mm BlockWise1x128 x BlockWise128x128 (M padded to 4), "
                     "torch quantization/SiLU*up/index_add; grouped_mm: bf16 torch._grouped_mm on dequantized weights",
        "bench_rc": bench_rc,
        "rows": rows, "failed": failed,
        "baseline_rows": [v for _, v in sorted(base.items())],
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if failed or bench_rc != 0 else 0)


if __name__ == "__main__":
    main()
