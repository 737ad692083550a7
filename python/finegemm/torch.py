"""finegemm as PyTorch operators.

    import finegemm.torch as fgt
    y = fgt.linear(x, weight, weight_scale_inv, weight_recipe=..., activation=...)   # torch.ops.finegemm.linear
    layer = fgt.FP8Linear(7168, 2048, block_size=(128, 128))                          # transformers' FP8Linear layout

The ops are torch.library custom ops with fake (meta) implementations, so they trace under
torch.compile(fullgraph=True) and replay under CUDA-graph capture. They run on the tensors' device (CPU or CUDA)
and, on CUDA, on torch's current stream. Recipes cross the op boundary as small int lists (see encode_weight_recipe).

Importing this module without torch installed works; using it raises ImportError.
"""

from typing import List, Optional, Tuple

import finegemm
from finegemm import _ext

try:
    import torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None

__all__ = [
    "FP8Linear",
    "encode_activation_recipe",
    "encode_weight_recipe",
    "linear",
    "moe_experts",
    "moe_activation_for",
    "quantize_activations",
    "recipes_for",
]

# Enum values as plain ints, read once here: the traced code below only does dict lookups on them.
_WG = {m.name: m.value for m in _ext.WeightGranularity}
_EL = {m.name: m.value for m in _ext.ElementType}
_SF = {m.name: m.value for m in _ext.ScaleFormat}
_AG = {m.name: m.value for m in _ext.ActGranularity}
_MA = {m.name: m.value for m in _ext.MoeActivation}


def _require_torch():
    if torch is None:
        raise ImportError("finegemm.torch needs PyTorch (pip install torch)")


# ---- Recipes ↔ int lists (custom ops take only tensors, numbers, lists and dtypes).


def encode_weight_recipe(recipe) -> List[int]:
    """[granularity, element, scale_format, block_n, block_k]."""
    return [recipe.granularity.value, recipe.element.value, recipe.scale_format.value, recipe.block_n, recipe.block_k]


def encode_activation_recipe(recipe) -> List[int]:
    """[granularity, group_size, pow2_scale]."""
    return [recipe.granularity.value, recipe.group_size, int(recipe.pow2_scale)]


def _weight_recipe(code):
    return _ext.WeightRecipe(
        _ext.WeightGranularity(code[0]), _ext.ElementType(code[1]), _ext.ScaleFormat(code[2]), code[3], code[4]
    )


def _activation_recipe(code):
    return _ext.ActivationRecipe(_ext.ActGranularity(code[0]), code[1], bool(code[2]))


def recipes_for(weight, weight_scale, block_size=None, static=False):
    """(weight code, activation code) for a checkpoint's tensors, the way transformers stores them.

    weight: [N, K] float8_e4m3fn, or [N, K/2] int8/uint8 packed FP4 (MX 1x32 scales).
    weight_scale: float32 or float8_e8m0fnu (int32: packed UE8M0); block scales [ceil(N/bn), ceil(K/bk)] with
    block_size=(bn, bk), [N] or [N, 1] per channel, a scalar per tensor.
    Dynamic activations: per-token-group along the weight's K block (rounded to a power of two with UE8M0 weight
    scales, as DeepSeek-V3.1/V4 do), per-token with per-channel or per-tensor weights. static=True: the
    checkpoint's per-tensor input scale.

    Pure Python on dtypes and shapes, so torch.compile traces it into constants.
    """
    _require_torch()
    if weight_scale.dtype == getattr(torch, "float8_e8m0fnu", None):
        scale_format = _SF["UE8M0"]
    elif weight_scale.dtype == torch.int32:
        scale_format = _SF["UE8M0_PACKED"]
    else:
        scale_format = _SF["FP32"]
    pow2 = int(scale_format != _SF["FP32"])
    k = weight.shape[-1]
    if weight.dtype == torch.int8 or weight.dtype == torch.uint8:  # packed FP4 E2M1, MX 1x32 scales
        weight_code = [_WG["MX"], _EL["FP4_E2M1"], scale_format, 1, 32]
        k = 2 * k
        group = 128 if k % 128 == 0 else 32
        activation_code = [_AG["PerTokenGroup"], group, 1 if group == 128 else 0]
    elif block_size is not None and weight_scale.dim() >= 2:
        block_n, block_k = int(block_size[0]), int(block_size[1])
        weight_code = [_WG["Block"], _EL["FP8_E4M3"], scale_format, block_n, block_k]
        group = block_k if block_k in (32, 128) else (128 if k % 128 == 0 else 32)
        activation_code = [_AG["PerTokenGroup"], group, pow2]
    elif weight_scale.numel() == 1:
        weight_code = [_WG["PerTensor"], _EL["FP8_E4M3"], scale_format, 0, 0]
        activation_code = [_AG["PerToken"], 0, 0]
    else:
        weight_code = [_WG["PerChannel"], _EL["FP8_E4M3"], scale_format, 1, 0]
        activation_code = [_AG["PerToken"], 0, 0]
    if static:
        activation_code = [_AG["StaticPerTensor"], 0, 0]
    return weight_code, activation_code


def moe_activation_for(act_name, has_gate=True, swiglu_alpha=None):
    """The MoeActivation value for a transformers experts module (config.hidden_act, has_gate, swiglu_alpha)."""
    name = (act_name or "silu").lower()
    if has_gate:
        if swiglu_alpha is not None:
            return _MA["SwiGLUOai"]
        if name in ("silu", "swish"):
            return _MA["SwiGLU"]
    else:
        if name in ("silu", "swish"):
            return _MA["Silu"]
        if name.startswith("gelu"):
            return _MA["Gelu"]
        if name in ("relu2", "relu_squared", "relu²"):
            return _MA["Relu2"]
    raise finegemm.FinegemmValueError(
        f"activation: finegemm runs gated silu (SwiGLU, GPT-OSS SwiGLU), or ungated silu, gelu and relu2, "
        f"got {act_name!r} with has_gate={has_gate}"
    )


# ---- The custom ops.


def _stream(tensor):
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


def _plain(tensor):
    # The op never differentiates: hand the C++ library the same memory without autograd's bookkeeping.
    return None if tensor is None else tensor.detach()


def _register():
    lib = "finegemm"

    @torch.library.custom_op(f"{lib}::linear", mutates_args=())
    def linear_op(
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        x_scale: Optional[torch.Tensor],
        bias: Optional[torch.Tensor],
        weight_recipe: List[int],
        activation_recipe: List[int],
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        out = torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype, device=x.device)
        _ext.linear(
            _plain(x),
            _plain(weight),
            _plain(weight_scale),
            out,
            weight_recipe=_weight_recipe(weight_recipe),
            activation=_activation_recipe(activation_recipe),
            x_scale=_plain(x_scale),
            bias=_plain(bias),
            stream=_stream(x),
        )
        return out

    @linear_op.register_fake
    def _(x, weight, weight_scale, x_scale, bias, weight_recipe, activation_recipe, out_dtype):
        return x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype)

    @torch.library.custom_op(f"{lib}::moe_experts", mutates_args=())
    def moe_experts_op(
        hidden: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        gate_up: torch.Tensor,
        gate_up_scale: torch.Tensor,
        down: torch.Tensor,
        down_scale: torch.Tensor,
        gate_up_act_scale: Optional[torch.Tensor],
        down_act_scale: Optional[torch.Tensor],
        gate_up_bias: Optional[torch.Tensor],
        down_bias: Optional[torch.Tensor],
        weight_recipe: List[int],
        activation_recipe: List[int],
        activation: int,
        swiglu_limit: float,
        swiglu_alpha: float,
        interleaved_gate_up: bool,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        out = torch.empty(hidden.shape, dtype=out_dtype, device=hidden.device)
        _ext.moe_experts(
            _plain(hidden),
            _plain(top_k_index),
            _plain(top_k_weights),
            _plain(gate_up),
            _plain(gate_up_scale),
            _plain(down),
            _plain(down_scale),
            out,
            weight_recipe=_weight_recipe(weight_recipe),
            activation_recipe=_activation_recipe(activation_recipe),
            gate_up_act_scale=_plain(gate_up_act_scale),
            down_act_scale=_plain(down_act_scale),
            gate_up_bias=_plain(gate_up_bias),
            down_bias=_plain(down_bias),
            activation=_ext.MoeActivation(activation),
            swiglu_limit=swiglu_limit,
            swiglu_alpha=swiglu_alpha,
            interleaved_gate_up=interleaved_gate_up,
            stream=_stream(hidden),
        )
        return out

    @moe_experts_op.register_fake
    def _(hidden, top_k_index, top_k_weights, gate_up, gate_up_scale, down, down_scale, gate_up_act_scale,
          down_act_scale, gate_up_bias, down_bias, weight_recipe, activation_recipe, activation, swiglu_limit,
          swiglu_alpha, interleaved_gate_up, out_dtype):
        return hidden.new_empty(hidden.shape, dtype=out_dtype)

    @torch.library.custom_op(f"{lib}::quantize_activations", mutates_args=())
    def quantize_activations_op(
        x: torch.Tensor, activation_recipe: List[int], x_scale: Optional[torch.Tensor]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        recipe = _activation_recipe(activation_recipe)
        x_q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        if recipe.is_static:
            # The static scale is read, and handed back (a copy: an op's output never aliases its input).
            scale = x_scale.detach().to(torch.float32).clone()
        else:
            shape = _ext.activation_scale_shape(recipe, x.shape[0], x.shape[1])
            scale = torch.empty(shape, dtype=torch.float32, device=x.device)
        _ext.quantize_activations(_plain(x), recipe, x_q, scale, stream=_stream(x))
        return x_q, scale

    @quantize_activations_op.register_fake
    def _(x, activation_recipe, x_scale):
        granularity, group = activation_recipe[0], activation_recipe[1]
        x_q = x.new_empty(x.shape, dtype=torch.float8_e4m3fn)
        if granularity == _AG["PerTokenGroup"]:
            scale = x.new_empty((x.shape[0], x.shape[1] // group), dtype=torch.float32)
        elif granularity == _AG["PerToken"]:
            scale = x.new_empty((x.shape[0],), dtype=torch.float32)
        else:
            scale = x_scale.new_empty(x_scale.shape, dtype=torch.float32)
        return x_q, scale


if torch is not None:
    _register()


# ---- Functional API: reshapes and defaults around the ops (traceable; it calls only torch.ops).


def _code(recipe, encode):
    return list(recipe) if isinstance(recipe, (list, tuple)) else encode(recipe)


def linear(x, weight, weight_scale, *, weight_recipe, activation, x_scale=None, bias=None, out_dtype=None):
    """y[..., N] = dequant(x[..., K]) @ dequant(weight).T (+ bias), through torch.ops.finegemm.linear.

    Recipes: finegemm recipe objects, or their int codes (encode_weight_recipe / recipes_for)."""
    _require_torch()
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    if out_dtype is None:
        out_dtype = x.dtype if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.bfloat16
    y = torch.ops.finegemm.linear(
        x2,
        weight,
        weight_scale,
        x_scale,
        bias,
        _code(weight_recipe, encode_weight_recipe),
        _code(activation, encode_activation_recipe),
        out_dtype,
    )
    return y.reshape(*x.shape[:-1], weight.shape[0])


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
    activation=_MA["SwiGLU"],
    swiglu_limit=0.0,
    swiglu_alpha=1.702,
    interleaved_gate_up=False,
    out_dtype=None,
):
    """The MoE block (finegemm.moe_experts) through torch.ops.finegemm.moe_experts; hidden [T, H]."""
    _require_torch()
    if not hidden.is_contiguous():
        hidden = hidden.contiguous()
    if out_dtype is None:
        out_dtype = hidden.dtype if hidden.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.bfloat16
    if not isinstance(activation, int):
        activation = activation.value
    return torch.ops.finegemm.moe_experts(
        hidden,
        top_k_index,
        top_k_weights,
        gate_up,
        gate_up_scale,
        down,
        down_scale,
        gate_up_act_scale,
        down_act_scale,
        gate_up_bias,
        down_bias,
        _code(weight_recipe, encode_weight_recipe),
        _code(activation_recipe, encode_activation_recipe),
        activation,
        float(swiglu_limit or 0.0),
        float(swiglu_alpha if swiglu_alpha is not None else 1.702),
        bool(interleaved_gate_up),
        out_dtype,
    )


def quantize_activations(x, activation_recipe, x_scale=None):
    """(x_q float8_e4m3fn, x_scale float32) through torch.ops.finegemm.quantize_activations; x [M, K]."""
    _require_torch()
    return torch.ops.finegemm.quantize_activations(x, _code(activation_recipe, encode_activation_recipe), x_scale)


# ---- An nn.Module with transformers' FP8Linear layout.


def _make_fp8_linear():
    class FP8Linear(torch.nn.Module):
        """A linear layer stored as transformers' FP8Linear stores it, run by finegemm.

        weight [N, K] float8_e4m3fn (or [N, K/2] int8 packed FP4), weight_scale_inv (block scales
        [ceil(N/bn), ceil(K/bk)] float32 or float8_e8m0fnu; a scalar with block_size=None), activation_scale (a
        float32 scalar, activation_scheme="static"), bias. State-dict keys match transformers', so a checkpoint's
        tensors load as they are.
        """

        def __init__(
            self,
            in_features,
            out_features,
            bias=False,
            block_size=(128, 128),
            activation_scheme="dynamic",
            scale_fmt="float",
            device=None,
        ):
            super().__init__()
            self.in_features = in_features
            self.out_features = out_features
            self.block_size = tuple(block_size) if block_size is not None else None
            self.activation_scheme = activation_scheme
            self.weight = torch.nn.Parameter(
                torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device=device), requires_grad=False
            )
            scale_dtype = torch.float8_e8m0fnu if scale_fmt == "ue8m0" else torch.float32
            if self.block_size is None:
                scale = torch.ones((), dtype=torch.float32, device=device)
            else:
                bn, bk = self.block_size
                scale = torch.ones(
                    (-(-out_features // bn), -(-in_features // bk)), dtype=scale_dtype, device=device
                )
            self.weight_scale_inv = torch.nn.Parameter(scale, requires_grad=False)
            if activation_scheme == "static":
                self.activation_scale = torch.nn.Parameter(
                    torch.ones((), dtype=torch.float32, device=device), requires_grad=False
                )
            else:
                self.register_parameter("activation_scale", None)
            if bias:
                self.bias = torch.nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False)
            else:
                self.register_parameter("bias", None)

        @classmethod
        def from_linear(cls, linear, weight_recipe=None, activation_scale=None):
            """Quantize a float nn.Linear with finegemm (on the CPU), block 128x128 FP32 scales by default.

            activation_scale: a float for activation_scheme="static" (e.g. amax of calibration inputs / 448)."""
            recipe = weight_recipe if weight_recipe is not None else finegemm.WeightRecipe.block(128, 128)
            if recipe.granularity == finegemm.WeightGranularity.Block:
                block_size = (recipe.block_n, recipe.block_k)
            elif recipe.granularity == finegemm.WeightGranularity.MX:
                block_size = (1, 32)
            else:
                block_size = None
            device = linear.weight.device
            w = linear.weight.detach().to("cpu", torch.float32).contiguous()
            w_q, w_scale = finegemm.quantize_weights(w, recipe)
            if recipe.element == finegemm.ElementType.FP4_E2M1:
                w_q = w_q.view(torch.int8)
            module = cls(
                linear.in_features,
                linear.out_features,
                bias=linear.bias is not None,
                block_size=block_size,
                activation_scheme="static" if activation_scale is not None else "dynamic",
                device=device,
            )
            module.weight = torch.nn.Parameter(w_q.to(device), requires_grad=False)
            module.weight_scale_inv = torch.nn.Parameter(w_scale.to(device), requires_grad=False)
            if activation_scale is not None:
                module.activation_scale.data.fill_(float(activation_scale))
            if linear.bias is not None:
                module.bias.data.copy_(linear.bias.detach().float())
            return module

        def forward(self, input):
            weight_code, activation_code = recipes_for(
                self.weight, self.weight_scale_inv, self.block_size, self.activation_scale is not None
            )
            return linear(
                input,
                self.weight,
                self.weight_scale_inv,
                weight_recipe=weight_code,
                activation=activation_code,
                x_scale=self.activation_scale,
                bias=self.bias,
                out_dtype=input.dtype,
            )

        def extra_repr(self):
            return (
                f"in_features={self.in_features}, out_features={self.out_features}, block_size={self.block_size}, "
                f"activation_scheme={self.activation_scheme}"
            )

    return FP8Linear


if torch is not None:
    FP8Linear = _make_fp8_linear()
else:  # pragma: no cover

    def __getattr__(name):
        if name == "FP8Linear":
            _require_torch()
        raise AttributeError(f"module 'finegemm.torch' has no attribute {name!r}")
