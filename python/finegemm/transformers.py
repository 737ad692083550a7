"""Run transformers' FineGrainedFP8 layers through finegemm.

    import finegemm.transformers
    finegemm.transformers.enable()
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=FineGrainedFP8Config(...))
    model.set_experts_implementation("finegemm")

enable() routes the forward of transformers' FP8 linear layers (FP8Linear, and FineGrainedLinear in the releases
that renamed it) through torch.ops.finegemm.linear, and registers an experts implementation "finegemm" that runs
the whole FP8Experts / FineGrainedExperts block with torch.ops.finegemm.moe_experts. Every recipe those layers hold
runs: block FP8 with float32 or UE8M0 scales, per-tensor, activation_scheme="static", and FP4 (MXFP4) experts.
finegemm is compiled ahead of time: nothing is fetched from the Hub.

Importing this module needs neither torch nor transformers; enable() needs both.
"""

__all__ = ["enable", "disable", "experts_forward", "linear_forward", "prepare"]

_LINEAR_CLASS_NAMES = ("FP8Linear", "FineGrainedLinear")
_EXPERTS_CLASS_NAMES = ("FP8Experts", "FineGrainedExperts")
_EXPERTS_INTERFACE_NAMES = ("ALL_FP8_EXPERTS_FUNCTIONS", "ALL_FINEGRAINED_EXPERTS_FUNCTIONS")
_IMPLEMENTATION = "finegemm"

_original_forwards = {}  # class → its forward before enable()


def _fp8_module():
    import importlib

    # Newer releases moved the module to integrations/finegrained.py (FineGrainedLinear, FineGrainedExperts).
    error = None
    for name in ("transformers.integrations.finegrained_fp8", "transformers.integrations.finegrained"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            error = e
    raise error


def _to_local(tensor):
    # Tensor-parallel checkpoints hold DTensors; finegemm reads the local shard.
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


def _is_quantized(weight):
    return weight is not None and weight.element_size() == 1


# ---- Linear.


def _original_forward(module):
    for cls in type(module).__mro__:
        if cls in _original_forwards:
            return _original_forwards[cls]
    raise RuntimeError(f"finegemm: {type(module).__name__}.forward was not patched by finegemm.transformers.enable()")


def linear_forward(self, input):
    """forward() of transformers' FP8 linear layers, through torch.ops.finegemm.linear."""
    import finegemm.torch as fgt

    weight = _to_local(self.weight)
    if not _is_quantized(weight) or getattr(self, "weight_global_scale", None) is not None:
        # A float weight (dequantized checkpoint), or NVFP4's two-level scales, which finegemm does not hold.
        return _original_forward(self)(self, input)
    scale = _to_local(self.weight_scale_inv)
    activation_scale = getattr(self, "activation_scale", None)
    weight_code, activation_code = fgt.recipes_for(weight, scale, self.block_size, activation_scale is not None)
    return fgt.linear(
        input,
        weight,
        scale,
        weight_recipe=weight_code,
        activation=activation_code,
        x_scale=_to_local(activation_scale) if activation_scale is not None else None,
        bias=self.bias,
        out_dtype=input.dtype,
    )


# ---- Experts.


def _gate_up_interleaved(module):
    """Whether gate_up's rows alternate gate/up ([g0, u0, g1, u1, ...]) rather than stack them ([gate; up]).

    Newer transformers interleave after loading and record it in `_gate_up_interleaved`; their gate split then
    always reads even/odd rows (GPT-OSS ships interleaved and may carry no flag). Older releases stack."""
    flag = getattr(module, "_gate_up_interleaved", None)
    if flag is not None:
        return bool(flag)
    if getattr(module, "is_concatenated", True) is False:
        return True
    return type(module).__name__.startswith("FineGrained") or getattr(module, "swiglu_alpha", None) is not None


def _deinterleave_rows(tensor, axis):
    """[g0, u0, g1, u1, ...] → [g0, g1, ...; u0, u1, ...] along `axis`, in place (byte view for 1-byte floats)."""
    import torch

    local = _to_local(tensor)
    src = local.data.view(torch.uint8) if local.element_size() == 1 else local.data
    moved = src.movedim(axis, 0)
    stacked = torch.cat([moved[0::2], moved[1::2]], dim=0)
    moved.copy_(stacked)


def prepare(model):
    """Put every quantized experts block of `model` into the layout finegemm reads (eagerly, once).

    Block-scaled FP8 experts that transformers interleaved after loading get their gate/up rows, block-scale rows
    and bias stacked back ([gate; up]), since one block scale must cover consecutive rows; `_gate_up_interleaved`
    is set to False to record it. Row-scaled layouts (MXFP4: one scale per row) stay as they are. experts_forward
    does this lazily on its first eager call; call prepare() before torch.compile or CUDA-graph capture."""
    for module in model.modules():
        if hasattr(module, "gate_up_proj") and getattr(module, "has_gate", True):
            _prepare_experts(module)
    return model


def _prepare_experts(module):
    if getattr(module, "_finegemm_prepared", False):
        return
    weight = _to_local(module.gate_up_proj)
    scale = getattr(module, "gate_up_proj_scale_inv", None)
    if _is_quantized(weight) and scale is not None and _to_local(scale).dim() >= 3 and _gate_up_interleaved(module):
        rows = weight.shape[-2]
        scale_rows = _to_local(scale).shape[-2]
        if scale_rows not in (rows, 1):  # block scales: stack the halves back
            for name, axis in (("gate_up_proj", -2), ("gate_up_proj_scale_inv", -2), ("gate_up_proj_bias", -1)):
                tensor = getattr(module, name, None)
                if tensor is not None and tensor.device.type != "meta":
                    _deinterleave_rows(tensor, axis)
            module._gate_up_interleaved = False
    module._finegemm_prepared = True


def _fallback_experts(module, hidden_states, top_k_index, top_k_weights):
    """Float (dequantized) experts: transformers' own grouped/batched implementation."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    for name in ("grouped_mm", "batched_mm"):
        if name in ALL_EXPERTS_FUNCTIONS:
            return ALL_EXPERTS_FUNCTIONS[name](module, hidden_states, top_k_index, top_k_weights)
    raise RuntimeError("finegemm: no transformers experts implementation left for float experts")


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The "finegemm" experts implementation: the whole block in one torch.ops.finegemm.moe_experts call."""
    import torch

    import finegemm.torch as fgt

    has_gate = getattr(self, "has_gate", True)
    up_name = "gate_up_proj" if has_gate else "up_proj"
    gate_up = _to_local(getattr(self, up_name))
    if not _is_quantized(gate_up) or getattr(self, f"{up_name}_global_scale", None) is not None:
        return _fallback_experts(self, hidden_states, top_k_index, top_k_weights)
    if not getattr(self, "_finegemm_prepared", False):
        if torch.compiler.is_compiling():
            raise RuntimeError(
                "finegemm: call finegemm.transformers.prepare(model) once before torch.compile or CUDA-graph capture"
            )
        _prepare_experts(self)

    gate_up_scale = _to_local(getattr(self, f"{up_name}_scale_inv"))
    down = _to_local(self.down_proj)
    down_scale = _to_local(self.down_proj_scale_inv)
    static = getattr(self, "activation_scheme", "dynamic") == "static"
    weight_code, activation_code = fgt.recipes_for(gate_up[0], gate_up_scale[0], self.block_size, static)

    config = getattr(self, "config", None)
    act_name = getattr(self, "act_fn_name", None)
    if act_name is None and config is not None:
        act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    swiglu_alpha = getattr(self, "swiglu_alpha", None)
    swiglu_limit = getattr(self, "swiglu_limit", None)
    if swiglu_limit is None:
        swiglu_limit = getattr(self, "limit", None)
    activation = fgt.moe_activation_for(act_name, has_gate, swiglu_alpha)

    gate_up_bias = getattr(self, f"{up_name}_bias", None) if getattr(self, "has_bias", False) else None
    down_bias = getattr(self, "down_proj_bias", None) if getattr(self, "has_bias", False) else None
    return fgt.moe_experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        gate_up,
        gate_up_scale,
        down,
        down_scale,
        weight_recipe=weight_code,
        activation_recipe=activation_code,
        gate_up_act_scale=self.gate_up_proj_activation_scale if static else None,
        down_act_scale=self.down_proj_activation_scale if static else None,
        gate_up_bias=gate_up_bias,
        down_bias=down_bias,
        activation=activation,
        swiglu_limit=swiglu_limit or 0.0,
        swiglu_alpha=swiglu_alpha,
        interleaved_gate_up=has_gate and _gate_up_interleaved(self),
        out_dtype=hidden_states.dtype,
    )


# ---- enable / disable.


def enable(model=None, linear=True, experts=True):
    """Route transformers' FineGrainedFP8 layers through finegemm.

    linear: patch the forward of the FP8 linear classes (every instance, present and future).
    experts: register the experts implementation "finegemm" (select it with
    model.set_experts_implementation("finegemm") or from_pretrained(..., experts_implementation="finegemm")).
    model: when given, also prepare() it and select "finegemm" for its experts.
    Returns the names of what was patched and registered.
    """
    import finegemm.torch  # noqa: F401  (registers torch.ops.finegemm.*)
    from transformers.integrations import moe

    fp8 = _fp8_module()
    done = []
    if linear:
        for name in _LINEAR_CLASS_NAMES:
            cls = getattr(fp8, name, None)
            if cls is None or cls in _original_forwards:
                continue
            _original_forwards[cls] = cls.forward
            cls.forward = linear_forward
            done.append(name)
    if experts:
        interfaces = [getattr(moe, "ALL_EXPERTS_FUNCTIONS", None)]
        interfaces += [getattr(fp8, name, None) for name in _EXPERTS_INTERFACE_NAMES]
        for interface in interfaces:
            if interface is None:
                continue
            # GeneralInterface.register is a classmethod: it adds to the interface's global mapping, which is
            # where set_experts_implementation() looks names up.
            if hasattr(type(interface), "register"):
                type(interface).register(_IMPLEMENTATION, experts_forward)
            else:
                interface[_IMPLEMENTATION] = experts_forward
            done.append(type(interface).__name__ + "[" + _IMPLEMENTATION + "]")
    if model is not None:
        prepare(model)
        if experts and hasattr(model, "set_experts_implementation"):
            try:
                model.set_experts_implementation(_IMPLEMENTATION)
            except ValueError:
                # Releases whose check lists a fixed set of names: select it on the configs directly.
                for module in model.modules():
                    config = getattr(module, "config", None)
                    if config is not None and hasattr(config, "_experts_implementation"):
                        config._experts_implementation = _IMPLEMENTATION
    return done


def disable():
    """Undo enable()'s linear patch (the "finegemm" experts implementation stays registered)."""
    for cls, forward in list(_original_forwards.items()):
        cls.forward = forward
        del _original_forwards[cls]
