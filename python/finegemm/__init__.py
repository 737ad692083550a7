"""finegemm: fine-grained FP8/FP4 linear and Mixture-of-Experts layers for every quantization recipe.

The ops take any array that crosses DLPack (numpy, torch, cupy, jax) without copying it. Each op writes into a
caller-allocated ``out=`` array, exactly like the C++ API; leave ``out`` out and a new array is allocated for you
(numpy or torch inputs). numpy has no bfloat16 / float8 dtypes of its own: use ml_dtypes'.

    import numpy as np, ml_dtypes, finegemm
    recipe = finegemm.WeightRecipe.block(128, 128)
    w_q, w_scale = finegemm.quantize_weights(w, recipe)
    y = finegemm.linear(x, w_q, w_scale, weight_recipe=recipe,
                        activation=finegemm.ActivationRecipe.per_token_group(128), out_dtype="bfloat16")

GPU work runs on ``stream`` (a cudaStream_t as int); by default on torch's (or cupy's) current stream for their
CUDA arrays. ``finegemm.torch`` has torch.library ops and an FP8Linear module; ``finegemm.transformers.enable()``
runs transformers' FineGrainedFP8 layers through finegemm.
"""

import sys as _sys

from . import _ext
from ._ext import (
    ActGranularity,
    ActivationRecipe,
    Backend,
    ElementType,
    Error,
    FinegemmRuntimeError,
    FinegemmTypeError,
    FinegemmValueError,
    MoeActivation,
    NamedRecipe,
    ScaleFormat,
    WeightGranularity,
    WeightRecipe,
    activation_scale_shape,
    all_recipes,
    backend_name,
    cuda_available,
    parse_backend,
    release_cached_memory,
    weight_scale_dtype,
    weight_scale_shape,
    weight_storage_cols,
)

__version__ = "0.1.0"

__all__ = [
    "ActGranularity",
    "ActivationRecipe",
    "Backend",
    "ElementType",
    "Error",
    "FinegemmRuntimeError",
    "FinegemmTypeError",
    "FinegemmValueError",
    "MoeActivation",
    "NamedRecipe",
    "ScaleFormat",
    "WeightGranularity",
    "WeightRecipe",
    "activation_scale_shape",
    "all_recipes",
    "backend_name",
    "cuda_available",
    "dequantize_weights",
    "linear",
    "moe_experts",
    "parse_backend",
    "quantize_activations",
    "quantize_weights",
    "release_cached_memory",
    "weight_scale_dtype",
    "weight_scale_shape",
    "weight_storage_cols",
]

_FLOAT_OUTPUTS = ("float32", "float16", "bfloat16")


# ---- Allocation conveniences: the only code here. Everything else is the C++ library's.


def _dtype_name(dtype):
    """'bfloat16' for "bfloat16", np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16 or torch.bfloat16."""
    if isinstance(dtype, str):
        return dtype[6:] if dtype.startswith("torch.") else dtype
    if type(dtype).__module__.startswith("torch"):
        return str(dtype)[6:]
    import numpy as np

    return np.dtype(dtype).name


def _framework(array):
    return type(array).__module__.split(".")[0]


def _numpy_dtype(name):
    import numpy as np

    if name in ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu"):
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError(f"finegemm: numpy arrays of {name} need ml_dtypes (pip install ml_dtypes)") from e
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _empty(like, shape, dtype, argument):
    """A new array for `argument`, of the framework and device of `like`."""
    name = _dtype_name(dtype)
    framework = _framework(like)
    shape = tuple(int(s) for s in shape)
    if framework == "torch":
        torch = _sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, name), device=like.device)
    if framework == "numpy":
        import numpy as np

        return np.empty(shape, dtype=_numpy_dtype(name))
    raise FinegemmTypeError(
        f"{argument}: finegemm allocates outputs for numpy and torch inputs only; pass {argument}= "
        f"(a {name} array of shape {list(shape)}) for {type(like).__module__}.{type(like).__name__} inputs"
    )


def _stream(stream, array):
    """The caller's stream: `stream` when given, else torch's / cupy's current stream for their CUDA arrays."""
    if stream is not None:
        return int(stream)
    framework = _framework(array)
    if framework == "torch" and array.is_cuda:
        return _sys.modules["torch"].cuda.current_stream(array.device).cuda_stream
    if framework == "cupy":
        return _sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def _shape(array):
    return tuple(int(s) for s in array.shape)


def _rows_cols(array):
    shape = _shape(array)
    if not shape:
        return 0, 0
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows, shape[-1]


def _default_out_dtype(x):
    name = _dtype_name(x.dtype)
    return name if name in _FLOAT_OUTPUTS else "bfloat16"


# ---- Ops.


def quantize_activations(x, recipe, x_q=None, x_scale=None, *, backend=Backend.Auto, stream=None):
    """x [M, K] float → (x_q [M, K] float8_e4m3fn, x_scale float32).

    Dynamic recipes write x_scale ([M, K/group] or [M]); the static recipe reads it (a scalar, required).
    """
    m, k = _rows_cols(x)
    if x_q is None:
        x_q = _empty(x, _shape(x), "float8_e4m3fn", "x_q")
    if x_scale is None:
        if recipe.is_static:
            raise FinegemmValueError("x_scale: the static recipe reads the scale (a float32 scalar), got None")
        x_scale = _empty(x, activation_scale_shape(recipe, m, k), "float32", "x_scale")
    _ext.quantize_activations(x, recipe, x_q, x_scale, backend=backend, stream=_stream(stream, x))
    return x_q, x_scale


def quantize_weights(w, recipe, w_q=None, w_scale=None, *, backend=Backend.Auto, stream=None):
    """w [N, K] float → (w_q, w_scale) per the recipe: w_q [N, K] float8_e4m3fn, or [N, K/2] uint8 packed FP4;
    w_scale of weight_scale_shape(recipe, N, K) and weight_scale_dtype(recipe)."""
    n, k = _rows_cols(w)
    if w_q is None:
        element = "uint8" if recipe.element == ElementType.FP4_E2M1 else "float8_e4m3fn"
        w_q = _empty(w, (n, weight_storage_cols(recipe, k)), element, "w_q")
    if w_scale is None:
        w_scale = _empty(w, weight_scale_shape(recipe, n, k), weight_scale_dtype(recipe), "w_scale")
    _ext.quantize_weights(w, recipe, w_q, w_scale, backend=backend, stream=_stream(stream, w))
    return w_q, w_scale


def dequantize_weights(w_q, w_scale, recipe, w=None, *, dtype="float32", backend=Backend.Auto, stream=None):
    """(w_q, w_scale) → w [N, K] (float32 by default)."""
    n, cols = _rows_cols(w_q)
    k = 2 * cols if recipe.element == ElementType.FP4_E2M1 else cols
    if w is None:
        w = _empty(w_q, (n, k), dtype, "w")
    _ext.dequantize_weights(w_q, w_scale, recipe, w, backend=backend, stream=_stream(stream, w_q))
    return w


def linear(
    x,
    weight,
    weight_scale,
    *,
    weight_recipe,
    activation,
    x_scale=None,
    bias=None,
    out=None,
    out_dtype=None,
    backend=Backend.Auto,
    stream=None,
    weights_static=False,
):
    """out [M, N] = dequant(x) @ dequant(weight).T (+ bias).

    x: [M, K] float32/float16/bfloat16 (quantized on the fly per `activation`), or float8_e4m3fn already
    quantized (then x_scale holds its scales). Static recipe: x_scale is the float32 input scale.
    out: written in place when given; else a new array of out_dtype (default: x's float dtype, or bfloat16).
    weights_static: a promise that the kernel enqueued just before this call does not write `weight` or
    `weight_scale` (weights loaded once, as in serving); a CUDA decode-sized call then starts reading the weights
    before that kernel ends (RunOptions::weights_static in the C++ API).
    """
    if out is None:
        out_dtype = _default_out_dtype(x) if out_dtype is None else out_dtype
        out = _empty(x, (_rows_cols(x)[0], _shape(weight)[0] if _shape(weight) else 0), out_dtype, "out")
    _ext.linear(
        x,
        weight,
        weight_scale,
        out,
        weight_recipe=weight_recipe,
        activation=activation,
        x_scale=x_scale,
        bias=bias,
        backend=backend,
        stream=_stream(stream, x),
        weights_static=weights_static,
    )
    return out


def moe_experts(
    hidden,
    top_k_index,
    top_k_weights,
    gate_up,
    gate_up_scale,
    down,
    down_scale,
    *,
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
    out=None,
    out_dtype=None,
    backend=Backend.Auto,
    stream=None,
    weights_constant=False,
):
    """The Mixture-of-Experts block of transformers' FP8Experts:
    out[t] = sum_j top_k_weights[t, j] * down_e(act(gate_up_e(hidden[t]))), e = top_k_index[t, j] (-1: skipped).

    gate_up [E, 2I, H] (FP4: [E, 2I, H/2]), down [E, H, I]; scales [E, <weight_scale_shape>].
    Static activation recipe: gate_up_act_scale and down_act_scale, [E] float32.
    weights_constant: a promise that the expert weights and scales at these addresses never change while the process
    runs (serving), so that what is derived from them alone (the fold scan of FP4 experts' scales) is made once and
    kept (RunOptions::weights_constant in the C++ API).
    """
    if out is None:
        out_dtype = _default_out_dtype(hidden) if out_dtype is None else out_dtype
        out = _empty(hidden, _shape(hidden), out_dtype, "out")
    _ext.moe_experts(
        hidden,
        top_k_index,
        top_k_weights,
        gate_up,
        gate_up_scale,
        down,
        down_scale,
        out,
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
        backend=backend,
        stream=_stream(stream, hidden),
        weights_constant=weights_constant,
    )
    return out
