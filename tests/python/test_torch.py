"""finegemm.torch: the custom ops, FP8Linear, torch.compile(fullgraph=True) and CUDA-graph capture.

Skipped where torch is absent (CI); runs on the device with torch on CPU and CUDA."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import finegemm  # noqa: E402
import finegemm.torch as fgt  # noqa: E402
from finegemm import ActivationRecipe, Backend, WeightRecipe  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and finegemm.cuda_available() else [])
RECIPES = finegemm.all_recipes()


def rel(out, ref):
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


def quantized(w, recipe):
    w_q, w_scale = finegemm.quantize_weights(w.float().cpu().contiguous(), recipe)
    if recipe.element == finegemm.ElementType.FP4_E2M1:
        w_q = w_q.view(torch.int8)  # transformers stores packed FP4 as int8
    return w_q, w_scale


def reference_linear(x, w_q, w_scale, recipe, x_scale=None, bias=None):
    """finegemm's CPU reference through the plain API (numpy-free: torch CPU tensors cross DLPack too)."""
    out = torch.empty((x.shape[0], w_q.shape[0]), dtype=torch.float32)
    finegemm.linear(x.float().cpu(), w_q.cpu(), w_scale.cpu(), weight_recipe=recipe.weight,
                    activation=recipe.activation, x_scale=None if x_scale is None else x_scale.cpu(),
                    bias=None if bias is None else bias.cpu(), out=out, backend=Backend.Reference)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_linear_op_every_recipe(device, recipe):
    m, n, k = 7, 256, 512
    x = torch.randn(m, k, dtype=torch.bfloat16)
    w = 0.05 * torch.randn(n, k)
    bias = torch.randn(n)
    w_q, w_scale = quantized(w, recipe.weight)
    x_scale = (x.float().abs().max() / 448.0).reshape(()) if recipe.activation.is_static else None
    ref = reference_linear(x, w_q, w_scale, recipe, x_scale, bias)
    y = fgt.linear(x.to(device), w_q.to(device), w_scale.to(device), weight_recipe=recipe.weight,
                   activation=recipe.activation, x_scale=None if x_scale is None else x_scale.to(device),
                   bias=bias.to(device))
    assert y.dtype == torch.bfloat16 and y.device.type == device and y.shape == (m, n)
    assert rel(y, ref) <= 3e-3


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_linear_module_matches_reference(device):
    linear = torch.nn.Linear(512, 384, bias=True)
    layer = fgt.FP8Linear.from_linear(linear).to(device)
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale_inv.shape == (3, 4)
    x = torch.randn(2, 3, 512, dtype=torch.bfloat16)
    y = layer(x.to(device))
    assert y.shape == (2, 3, 384) and y.dtype == torch.bfloat16
    recipe = next(r for r in RECIPES if r.name == "block128x128/fp32 x group128")
    ref = reference_linear(x.reshape(6, 512), layer.weight.cpu(), layer.weight_scale_inv.cpu(), recipe,
                           bias=layer.bias.cpu())
    assert rel(y.reshape(6, 384), ref) <= 3e-3


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_linear_static_and_state_dict(device):
    linear = torch.nn.Linear(256, 128, bias=False)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    layer = fgt.FP8Linear.from_linear(linear, activation_scale=float(x.float().abs().max() / 448.0)).to(device)
    assert set(layer.state_dict()) == {"weight", "weight_scale_inv", "activation_scale"}
    y = layer(x.to(device))
    recipe = next(r for r in RECIPES if r.name == "block128x128/fp32 x static")
    ref = reference_linear(x, layer.weight.cpu(), layer.weight_scale_inv.cpu(), recipe,
                           x_scale=layer.activation_scale.detach().cpu())
    assert rel(y, ref) <= 3e-3


def test_ops_pass_opcheck():
    recipe = RECIPES[0]
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    w_q, w_scale = quantized(0.05 * torch.randn(128, 256), recipe.weight)
    args = (x, w_q, w_scale, None, None, fgt.encode_weight_recipe(recipe.weight),
            fgt.encode_activation_recipe(recipe.activation), torch.bfloat16)
    # NOTE: no "test_schema" for linear: torch 2.11's SchemaCheckMode multiplies the inputs to detect mutation, and
    # "mul_cpu_reduced_float" is not implemented for Float8_e4m3fn (the weight), so it fails inside torch (seen on the
    # H200 machine). quantize_activations below (bf16 input) still runs it.
    torch.library.opcheck(torch.ops.finegemm.linear.default, args,
                          test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.finegemm.quantize_activations.default,
                          (x, fgt.encode_activation_recipe(recipe.activation), None),
                          test_utils=("test_schema", "test_faketensor"))


def moe_operands(recipe, device, tokens=5, hidden=256, inter=128, experts=4, top_k=2):
    gate_up = 0.05 * torch.randn(experts, 2 * inter, hidden)
    down = 0.05 * torch.randn(experts, hidden, inter)
    pairs = [quantized(gate_up[e], recipe.weight) for e in range(experts)]
    gu_q, gu_s = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    pairs = [quantized(down[e], recipe.weight) for e in range(experts)]
    dn_q, dn_s = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    index[0, -1] = -1
    weights = torch.rand(tokens, top_k)
    kwargs = {}
    if recipe.activation.is_static:
        kwargs["gate_up_act_scale"] = torch.full((experts,), float(x.float().abs().max() / 448.0))
        kwargs["down_act_scale"] = torch.full((experts,), 2.0 / 448.0)
    tensors = [x, index, weights, gu_q, gu_s, dn_q, dn_s]
    return [t.to(device) for t in tensors], {k: v.to(device) for k, v in kwargs.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_moe_op_every_recipe(device, recipe):
    tensors, kwargs = moe_operands(recipe, device)
    y = fgt.moe_experts(*tensors, weight_recipe=recipe.weight, activation_recipe=recipe.activation, **kwargs)
    ref = torch.empty(tensors[0].shape, dtype=torch.float32)
    finegemm.moe_experts(*[t.cpu() for t in tensors], weight_recipe=recipe.weight,
                         activation_recipe=recipe.activation, out=ref, backend=Backend.Reference,
                         **{k: v.cpu() for k, v in kwargs.items()})
    # Issue 4's bar for the whole block: 1e-2 (one E4M3 flip of the requantized intermediate moves a 5-token output
    # by up to ~8e-3; measured 3.1e-3..8.3e-3 on the H200).
    assert y.dtype == torch.bfloat16 and rel(y, ref) <= (1e-2 if device == "cuda" else 3e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    layer = fgt.FP8Linear.from_linear(torch.nn.Linear(256, 256)).to(device)
    x = torch.randn(4, 256, dtype=torch.bfloat16, device=device)
    eager = layer(x)
    # aot_eager on the CPU traces through the fake implementations without a C++ toolchain for inductor.
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    assert torch.equal(compiled(x), eager)
    explanation = torch._dynamo.explain(layer)(x)
    assert explanation.graph_break_count == 0


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device and finegemm built with CUDA")
def test_cuda_graph_capture_and_current_stream():
    layer = fgt.FP8Linear.from_linear(torch.nn.Linear(512, 256)).cuda()
    x = torch.randn(8, 512, dtype=torch.bfloat16, device="cuda")
    expected = layer(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # runs on the caller's (non-default) current stream
        on_side_stream = layer(x)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(on_side_stream, expected)

    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    layer(static_x)  # warm up outside capture
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    fresh = torch.randn_like(x)
    static_x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, layer(fresh))


def test_numpy_and_torch_share_the_api():
    recipe = WeightRecipe.block(128, 128)
    w = 0.05 * torch.randn(256, 256)
    w_q, w_scale = finegemm.quantize_weights(w, recipe)  # torch CPU tensors in, torch tensors out
    assert isinstance(w_q, torch.Tensor) and w_q.dtype == torch.float8_e4m3fn
    y = finegemm.linear(torch.randn(2, 256), w_q, w_scale, weight_recipe=recipe,
                        activation=ActivationRecipe.per_token_group(128))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    with pytest.raises(TypeError, match="weight_scale"):
        finegemm.linear(torch.randn(2, 256), w_q, w_scale.double(), weight_recipe=recipe,
                        activation=ActivationRecipe.per_token_group(128))
