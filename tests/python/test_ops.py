"""The Python API on the CPU, through DLPack with numpy + ml_dtypes: every recipe through linear and moe_experts
against Backend.Reference (and the reference against numpy in float64), zero-copy outputs, error mapping."""

import ml_dtypes
import numpy as np
import pytest

import finegemm
from finegemm import ActivationRecipe, Backend, MoeActivation, WeightRecipe

BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = {"bfloat16": 3e-3, "float32": 1e-3}  # RECIPES.md, numerical acceptance
# The MoE block requantizes its intermediate: one E4M3 rounding flip of a token's largest code moves that token by
# percents, so the block is held to issue 4's 1e-2 (as test_cpu_fast and test_cuda_moe do), not to one GEMM's 1e-3.
# (test_moe_activations[SwiGLUOai] measured 2.78e-3 on one fresh-data CI run.)
MOE_TOL = 1e-2
RECIPES = finegemm.all_recipes()


def rng():
    return np.random.default_rng()  # fresh data on every run


def poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype=np.dtype(dtype) if dtype != "bfloat16" else BF16)


def rel(out, ref):
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all(), "non-finite output for finite input (or an unwritten element)"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def quantized_weight(w, recipe):
    """Quantize [.., N, K] float32 weights with finegemm, expert by expert into slices of one array (no copies)."""
    *lead, n, k = w.shape
    element = np.uint8 if recipe.element == finegemm.ElementType.FP4_E2M1 else ml_dtypes.float8_e4m3fn
    scale_dtype = {"float32": np.float32, "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu, "int32": np.int32}[
        finegemm.weight_scale_dtype(recipe)
    ]
    w_q = np.empty((*lead, n, finegemm.weight_storage_cols(recipe, k)), dtype=element)
    w_scale = np.empty((*lead, *finegemm.weight_scale_shape(recipe, n, k)), dtype=scale_dtype)
    for index in np.ndindex(*lead):
        finegemm.quantize_weights(w[index], recipe, w_q[index + (Ellipsis,)], w_scale[index + (Ellipsis,)])
    return w_q, w_scale


def dequantized_activations(x, recipe, x_scale=None):
    """float64 x after the activation recipe's round trip (finegemm quantizes, numpy dequantizes)."""
    x_q, scale = finegemm.quantize_activations(x, recipe, x_scale=x_scale)
    q = x_q.astype(np.float64)
    s = scale.astype(np.float64)
    if recipe.granularity == finegemm.ActGranularity.PerTokenGroup:
        return q * np.repeat(s, recipe.group_size, axis=1)
    if recipe.granularity == finegemm.ActGranularity.PerToken:
        return q * s[:, None]
    return q * float(s)


def static_scale(x):
    return np.array(np.abs(x).max() / 448.0, dtype=np.float32)


def test_all_recipes_cover_recipes_md():
    names = [r.name for r in RECIPES]
    assert len(names) == len(set(names)) >= 16
    for needed in ("block128x128/fp32 x group128", "block128x128/ue8m0 x group128-pow2", "channel/fp32 x token",
                   "tensor/fp32 x static", "mxfp4/ue8m0 x group32", "block128x128/fp32 x static"):
        assert needed in names
    assert finegemm.weight_scale_shape(WeightRecipe.block(128, 128), 7168, 2048) == (56, 16)
    assert finegemm.activation_scale_shape(ActivationRecipe.per_token_group(128), 4, 512) == (4, 4)
    assert finegemm.activation_scale_shape(ActivationRecipe.static_per_tensor(), 4, 512) == ()


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_linear_every_recipe(recipe, out_dtype):
    g = rng()
    m, n, k = 5, 192, 256
    x = g.standard_normal((m, k)).astype(np.float32)
    w = (0.05 * g.standard_normal((n, k))).astype(np.float32)
    bias = g.standard_normal(n).astype(np.float32)
    w_q, w_scale = quantized_weight(w, recipe.weight)
    x_scale = static_scale(x) if recipe.activation.is_static else None

    outs = {}
    for backend in (Backend.Reference, Backend.Cpu):
        out = poisoned((m, n), out_dtype)
        got = finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                              x_scale=x_scale, bias=bias, out=out, backend=backend)
        assert got is out
        outs[backend] = out

    # The reference against numpy in float64, from the dequantized operands: the binding passed the right bytes.
    w_deq = finegemm.dequantize_weights(w_q, w_scale, recipe.weight)
    expected = dequantized_activations(x, recipe.activation, x_scale) @ w_deq.astype(np.float64).T + bias
    assert rel(outs[Backend.Reference], expected) <= TOL[out_dtype]
    # The fast path against the reference.
    assert rel(outs[Backend.Cpu], np.asarray(outs[Backend.Reference], np.float64)) <= TOL[out_dtype]


def test_linear_weights_static_is_passed_and_changes_nothing_on_the_cpu():
    # The promise only lets a CUDA decode call read weights early; on the CPU the same bits come back.
    recipe = RECIPES[0]
    g = rng()
    x = g.standard_normal((3, 256)).astype(np.float32)
    w_q, w_scale = quantized_weight((0.05 * g.standard_normal((128, 256))).astype(np.float32), recipe.weight)
    outs = [finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                            out=poisoned((3, 128), "float32"), backend=Backend.Cpu, weights_static=static)
            for static in (False, True)]
    assert np.isfinite(outs[0]).all()
    assert np.array_equal(outs[0], outs[1])
    with pytest.raises(TypeError):
        finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                        weights_statics=True)


def moe_case(recipe, activation=MoeActivation.SwiGLU, tokens=6, hidden=256, inter=128, experts=4, top_k=2,
             bias=False):
    g = rng()
    gated = activation in (MoeActivation.SwiGLU, MoeActivation.SwiGLUOai)
    rows = 2 * inter if gated else inter
    x = g.standard_normal((tokens, hidden)).astype(np.float32)
    gate_up = (0.05 * g.standard_normal((experts, rows, hidden))).astype(np.float32)
    down = (0.05 * g.standard_normal((experts, hidden, inter))).astype(np.float32)
    index = np.stack([g.permutation(experts)[:top_k] for _ in range(tokens)]).astype(np.int32)
    index[0, -1] = -1  # a skipped slot
    weights = g.random((tokens, top_k)).astype(np.float32)
    args = dict(weight_recipe=recipe.weight, activation_recipe=recipe.activation, activation=activation)
    if recipe.activation.is_static:
        args["gate_up_act_scale"] = np.full(experts, np.abs(x).max() / 448.0, np.float32)
        args["down_act_scale"] = np.full(experts, 2.0 / 448.0, np.float32)
    if bias:
        args["gate_up_bias"] = (0.1 * g.standard_normal((experts, rows))).astype(np.float32)
        args["down_bias"] = (0.1 * g.standard_normal((experts, hidden))).astype(np.float32)
    gu_q, gu_s = quantized_weight(gate_up, recipe.weight)
    dn_q, dn_s = quantized_weight(down, recipe.weight)
    return (x, index, weights, gu_q, gu_s, dn_q, dn_s), args


def run_moe(operands, args, out_dtype="bfloat16", backends=(Backend.Reference, Backend.Cpu)):
    outs = {}
    for backend in backends:
        out = poisoned(operands[0].shape, out_dtype)
        got = finegemm.moe_experts(*operands, out=out, backend=backend, **args)
        assert got is out
        outs[backend] = out
    return outs


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_moe_every_recipe(recipe):
    operands, args = moe_case(recipe)
    outs = run_moe(operands, args)
    ref = np.asarray(outs[Backend.Reference], np.float64)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    assert rel(outs[Backend.Cpu], ref) <= TOL["bfloat16"]


@pytest.mark.parametrize(
    "activation,limit,interleaved,bias",
    [
        (MoeActivation.SwiGLUOai, 7.0, True, True),  # GPT-OSS
        (MoeActivation.SwiGLU, 10.0, False, False),  # DeepSeek-V4-like limit
        (MoeActivation.Silu, 0.0, False, False),  # no gate
    ],
)
def test_moe_activations(activation, limit, interleaved, bias):
    recipe = next(r for r in RECIPES if r.name == "mxfp4/ue8m0 x group32")
    operands, args = moe_case(recipe, activation=activation, bias=bias)
    args.update(swiglu_limit=limit, interleaved_gate_up=interleaved)
    outs = run_moe(operands, args, out_dtype="float32")
    assert rel(outs[Backend.Cpu], np.asarray(outs[Backend.Reference], np.float64)) <= MOE_TOL


def test_moe_deterministic():
    recipe = RECIPES[0]
    operands, args = moe_case(recipe, tokens=16)
    first = finegemm.moe_experts(*operands, **args)
    second = finegemm.moe_experts(*operands, **args)
    assert first.view(np.uint16).tobytes() == second.view(np.uint16).tobytes()
    # The serving promise (RunOptions::weights_constant) changes no bit: on the CPU it derives nothing.
    promised = finegemm.moe_experts(*operands, weights_constant=True, **args)
    assert promised.view(np.uint16).tobytes() == first.view(np.uint16).tobytes()


def test_zero_copy_output_and_inputs():
    recipe = RECIPES[0]
    g = rng()
    x = g.standard_normal((3, 128)).astype(np.float32)
    w_q, w_scale = quantized_weight((0.05 * g.standard_normal((128, 128))).astype(np.float32), recipe.weight)
    # A view into a bigger buffer: the op must write through it, never into a copy.
    storage = poisoned((2, 3, 128), "float32")
    out = storage[1]
    finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation, out=out)
    assert np.isfinite(storage[1]).all() and np.isnan(storage[0]).all()
    # The weight is read in place: changing its bytes changes the result.
    before = storage[1].copy()
    w_q.view(np.uint8)[:] = 0
    finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation, out=out)
    assert np.all(storage[1] == 0) and np.any(before != 0)


def test_allocating_wrappers():
    recipe = RECIPES[1]  # UE8M0 scales come back as float8_e8m0fnu
    g = rng()
    w = (0.05 * g.standard_normal((256, 256))).astype(np.float32)
    w_q, w_scale = finegemm.quantize_weights(w, recipe.weight)
    assert w_q.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and w_scale.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    x = g.standard_normal((4, 256)).astype(BF16)
    y = finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation)
    assert y.dtype == BF16 and y.shape == (4, 256)
    y32 = finegemm.linear(x, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                          out_dtype=np.float32)
    assert y32.dtype == np.float32
    assert rel(y, np.asarray(y32, np.float64)) <= 3e-3
    x_q, x_scale = finegemm.quantize_activations(x, recipe.activation)
    assert x_q.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and x_scale.shape == (4, 2)
    # Pre-quantized activations: x_scale carries their scales.
    y_pre = finegemm.linear(x_q, w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                            x_scale=x_scale, out_dtype="float32")
    assert rel(y_pre, np.asarray(y32, np.float64)) <= 1e-3
    fp4 = WeightRecipe.mxfp4()
    w4_q, w4_scale = finegemm.quantize_weights(w, fp4)
    assert w4_q.dtype == np.uint8 and w4_q.shape == (256, 128) and w4_scale.shape == (256, 8)
    assert finegemm.dequantize_weights(w4_q, w4_scale, fp4).shape == (256, 256)


def test_wrong_scale_shape_is_value_error_with_cpp_message():
    recipe = RECIPES[0]
    g = rng()
    x = g.standard_normal((2, 256)).astype(np.float32)
    w_q, w_scale = quantized_weight((0.05 * g.standard_normal((256, 256))).astype(np.float32), recipe.weight)
    with pytest.raises(ValueError) as info:
        finegemm.linear(x, w_q, w_scale[:, :1], weight_recipe=recipe.weight, activation=recipe.activation)
    assert isinstance(info.value, finegemm.FinegemmValueError) and isinstance(info.value, finegemm.Error)
    assert str(info.value) == "weight_scale: expected shape [2, 2] for N=256, K=256 with 128x128 blocks, got [2, 1]"


def test_wrong_dtype_is_type_error():
    recipe = RECIPES[0]
    g = rng()
    x = g.standard_normal((2, 256)).astype(np.float32)
    w_q, w_scale = quantized_weight((0.05 * g.standard_normal((256, 256))).astype(np.float32), recipe.weight)
    # A dtype finegemm knows, in the wrong place: the C++ validation says so.
    with pytest.raises(TypeError) as info:
        finegemm.linear(x, w_q.view(np.uint8), w_scale, weight_recipe=recipe.weight, activation=recipe.activation)
    assert isinstance(info.value, finegemm.FinegemmTypeError)
    assert str(info.value).startswith("weight:") and "float8_e4m3fn" in str(info.value)
    # A dtype no op takes: the binding says so.
    with pytest.raises(TypeError, match="x: expected .* got numpy.ndarray of dtype float64"):
        finegemm.linear(x.astype(np.float64), w_q, w_scale, weight_recipe=recipe.weight,
                        activation=recipe.activation)
    with pytest.raises(TypeError, match="weight_scale: expected an array, got None"):
        finegemm.linear(x, w_q, None, weight_recipe=recipe.weight, activation=recipe.activation)
    with pytest.raises(TypeError, match="x: expected an array"):
        finegemm.linear([[1.0] * 256], w_q, w_scale, weight_recipe=recipe.weight, activation=recipe.activation,
                        out=np.empty((1, 256), np.float32))


def test_bad_values_are_value_errors():
    recipe = RECIPES[0]
    operands, args = moe_case(recipe)
    x, index, weights, gu_q, gu_s, dn_q, dn_s = operands
    bad_index = index.copy()
    bad_index[1, 0] = 4  # E = 4
    with pytest.raises(ValueError, match="top_k_index"):
        finegemm.moe_experts(x, bad_index, weights, gu_q, gu_s, dn_q, dn_s, **args)
    bad_scale = gu_s.copy()
    bad_scale[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="gate_up_scale"):
        finegemm.moe_experts(x, index, weights, gu_q, bad_scale, dn_q, dn_s, **args)
    with pytest.raises(ValueError):
        finegemm.moe_experts(x, index, weights, gu_q, gu_s, dn_q, dn_s, out=poisoned((6, 255), "float32"), **args)


def test_recipe_objects():
    r = WeightRecipe.block(64, 128, finegemm.ScaleFormat.UE8M0)
    assert (r.block_n, r.block_k, r.scale_format) == (64, 128, finegemm.ScaleFormat.UE8M0)
    assert r == WeightRecipe(finegemm.WeightGranularity.Block, finegemm.ElementType.FP8_E4M3,
                             finegemm.ScaleFormat.UE8M0, 64, 128)
    assert r.name == "block64x128/ue8m0" and "block64x128" in repr(r)
    assert ActivationRecipe.static_per_tensor().is_static
    assert ActivationRecipe.per_token_group(32, True).name == "group32-pow2"
    assert finegemm.parse_backend("ref") == Backend.Reference
    with pytest.raises(ValueError, match="backend"):
        finegemm.parse_backend("tpu")


def test_release_cached_memory():
    # With a GPU: synchronizes and trims finegemm's scratch pool; a bad device index is a value error naming it.
    # Without CUDA: a no-op.
    if finegemm.cuda_available():
        finegemm.release_cached_memory(0)
        with pytest.raises(finegemm.FinegemmValueError, match="cuda_device"):
            finegemm.release_cached_memory(-1)
    else:
        assert finegemm.release_cached_memory(0) is None
