"""Expert parallelism over NCCL: one MoE layer whose E experts are spread over the ranks of a process group.

Rank r holds the global experts [r*E/W, (r+1)*E/W); ``top_k_index`` holds GLOBAL expert ids. With the default
``wire_y="float32"`` the output equals ``finegemm.moe_experts`` on one GPU with all experts, bit for bit;
``"bfloat16"`` halves the combine's bytes (within RECIPES.md's tolerance). See docs/ep.md.

    import torch.distributed as dist, finegemm.ep as ep
    dist.init_process_group("nccl")
    group = ep.group_from_torch()                   # one NCCL communicator of finegemm's, on this rank's GPU
    out = ep.moe_experts_ep(hidden, idx, w, gate_up, gate_up_scale, down, down_scale, group=group,
                            num_global_experts=256, weight_recipe=..., activation_recipe=...)

Static recipes: ``gate_up_act_scale`` is [E] (every expert's, the same on every rank); ``down_act_scale`` [E/W] or [E].
"""

import sys as _sys

from . import _ext, _default_out_dtype, _empty, _shape, _stream
from ._ext import EpGroup, MoeActivation, ep_available, ep_unique_id

__all__ = ["EpGroup", "ep_available", "ep_unique_id", "group_from_torch", "moe_experts_ep"]


def group_from_torch(process_group=None, device=None):
    """An EpGroup over the ranks of a torch.distributed process group (default: the world).

    Rank 0 of the group makes the NCCL unique id and broadcasts it with broadcast_object_list; every rank then joins
    finegemm's communicator on ``device`` (default: torch.cuda.current_device()). Collective: call it on every rank.
    """
    torch = _sys.modules.get("torch") or __import__("torch")
    dist = torch.distributed
    rank = dist.get_rank(process_group)
    world = dist.get_world_size(process_group)
    if device is None:
        device = torch.cuda.current_device()
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    payload = [ep_unique_id() if rank == 0 else None]
    source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    dist.broadcast_object_list(payload, src=source, group=process_group, device=device)
    return EpGroup.init(rank, world, payload[0], device.index)


def moe_experts_ep(
    hidden,
    top_k_index,
    top_k_weights,
    gate_up,
    gate_up_scale,
    down,
    down_scale,
    *,
    group,
    num_global_experts,
    weight_recipe,
    activation_recipe,
    gate_up_act_scale=None,
    down_act_scale=None,
    gate_up_bias=None,
    down_bias=None,
    activation=MoeActivation.SwiGLU,
    swiglu_limit=0.0,
    swiglu_alpha=1.702,
    interleaved_gate_up=False,
    wire_y="float32",
    chunks=1,
    out=None,
    out_dtype=None,
    stream=None,
):
    """This rank's part of an expert-parallel MoE layer; the same arguments as finegemm.moe_experts, except: the
    rank's tokens, its E/W experts (gate_up [E/W, 2I, H], ...), GLOBAL ids in top_k_index. Every rank of the group
    must call it, with the same num_global_experts, wire_y and chunks."""
    if out is None:
        out_dtype = _default_out_dtype(hidden) if out_dtype is None else out_dtype
        out = _empty(hidden, _shape(hidden), out_dtype, "out")
    _ext.moe_experts_ep(
        hidden,
        top_k_index,
        top_k_weights,
        gate_up,
        gate_up_scale,
        down,
        down_scale,
        out,
        group=group,
        num_global_experts=num_global_experts,
        weight_recipe=weight_recipe,
        activation_recipe=activation_recipe,
        gate_up_act_scale=gate_up_act_scale,
        down_act_scale=down_act_scale,
        gate_up_bias=gate_up_bias,
        down_bias=down_bias,
        activation=activation,
        swiglu_limit=swiglu_limit,
        swiglu_alpha=swiglu_alpha,
        interleaved_gate_up=interleaved_gate_up,
        wire_y=wire_y,
        chunks=chunks,
        stream=_stream(stream, hidden),
    )
    return out
