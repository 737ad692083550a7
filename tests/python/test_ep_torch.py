"""finegemm.ep through torch.distributed: two processes (torch.multiprocessing spawn, NCCL process group), each holding
half of the experts, against finegemm.moe_experts on one GPU with all experts.

Skipped unless torch sees 2 GPUs and finegemm was built with expert parallelism. Each rank builds the same global
layer from a shared seed, so no weights cross processes."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

import finegemm  # noqa: E402
import finegemm.ep  # noqa: E402

WORLD = 2
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= WORLD and finegemm.cuda_available()
         and finegemm.ep.ep_available()),
    reason="needs 2 GPUs, torch with CUDA and finegemm built with NCCL (expert parallelism)",
)


def quantized(w, recipe):
    w_q, w_scale = finegemm.quantize_weights(w.float().cpu().contiguous(), recipe)
    if recipe.element == finegemm.ElementType.FP4_E2M1:
        w_q = w_q.view(torch.int8)
    return w_q, w_scale


def make_layer(seed, recipe, tokens, hidden=512, inter=256, experts=16, top_k=4, skew=False):
    """The global layer (CPU tensors), the same on every rank for the same seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    gu_q, gu_s = zip(*(quantized(gate_up[e], recipe.weight) for e in range(experts)))
    dn_q, dn_s = zip(*(quantized(down[e], recipe.weight) for e in range(experts)))
    scores = torch.rand(tokens, experts, generator=g)
    if skew:  # most tokens pick rank 0's experts
        scores[:, : experts // WORLD] += 0.9
    idx = scores.topk(top_k, dim=1).indices.to(torch.int32)
    idx[3::7, -1] = -1  # skipped slots
    if tokens > 2:
        idx[1, :] = -1  # a token routed nowhere
    w = torch.rand(tokens, top_k, generator=g) + 0.05
    w = w / w.sum(dim=1, keepdim=True)
    layer = dict(hidden=x, top_k_index=idx, top_k_weights=w, gate_up=torch.stack(gu_q),
                 gate_up_scale=torch.stack(gu_s), down=torch.stack(dn_q), down_scale=torch.stack(dn_s))
    if recipe.activation.is_static:
        layer["gate_up_act_scale"] = torch.full((experts,), float(x.float().abs().max() / 448.0))
        layer["down_act_scale"] = torch.full((experts,), 0.05)
    return layer


def worker(rank, init_file, results):
    import torch.distributed as dist

    import finegemm.ep as ep

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        group = ep.group_from_torch()
        assert (group.rank, group.world, group.device) == (rank, WORLD, rank)
        recipes = {r.name: r for r in finegemm.all_recipes()}
        experts = 16
        local = experts // WORLD
        lines = []
        for case, (name, tokens, skew) in enumerate([
            ("block128x128/fp32 x group128", 16, False),
            ("block128x128/ue8m0 x group128-pow2", 300, True),
            ("block128x128/fp32 x static", 16, False),
            ("mxfp4/ue8m0 x group32", 16, True),
        ]):
            recipe = recipes[name]
            layer = make_layer(1234 + case, recipe, WORLD * tokens, experts=experts, skew=skew)
            dev = {k: v.cuda() for k, v in layer.items()}
            ref = finegemm.moe_experts(**dev, weight_recipe=recipe.weight, activation_recipe=recipe.activation)
            mine = slice(rank * tokens, (rank + 1) * tokens)
            experts_mine = slice(rank * local, (rank + 1) * local)
            kwargs = dict(hidden=dev["hidden"][mine], top_k_index=dev["top_k_index"][mine],
                          top_k_weights=dev["top_k_weights"][mine], gate_up=dev["gate_up"][experts_mine],
                          gate_up_scale=dev["gate_up_scale"][experts_mine], down=dev["down"][experts_mine],
                          down_scale=dev["down_scale"][experts_mine])
            if recipe.activation.is_static:
                kwargs["gate_up_act_scale"] = dev["gate_up_act_scale"]  # every expert's
                kwargs["down_act_scale"] = dev["down_act_scale"][experts_mine]
            for wire, chunks in (("float32", 1), ("float32", 2), ("bfloat16", 1)):
                out = ep.moe_experts_ep(**kwargs, group=group, num_global_experts=experts,
                                        weight_recipe=recipe.weight, activation_recipe=recipe.activation,
                                        wire_y=wire, chunks=chunks)
                torch.cuda.synchronize()
                expected = ref[mine]
                rel = ((out.double() - expected.double()).norm() / expected.double().norm()).item()
                exact = torch.equal(out.view(torch.int16), expected.view(torch.int16))
                ok = exact if wire == "float32" else (rel <= 3e-3 and torch.isfinite(out).all().item())
                lines.append(f"rank {rank} {name} T={tokens} wire={wire} chunks={chunks}: rel={rel:.2e} "
                             f"exact={exact} {'PASS' if ok else 'FAIL'}")
        results[rank] = lines
        del group
    finally:
        dist.destroy_process_group()


def test_ep_matches_single_gpu_through_torch_distributed():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        manager = mp.Manager()
        results = manager.dict()
        mp.spawn(worker, args=(os.path.join(tmp, "init"), results), nprocs=WORLD, join=True)
        lines = [line for rank in range(WORLD) for line in results.get(rank, ["rank %d: no result" % rank])]
    print("\n".join(lines))
    assert all(line.endswith("PASS") for line in lines), "\n".join(lines)
