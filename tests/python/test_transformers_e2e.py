"""transformers end to end: a tiny random-weight Qwen3-MoE, quantized by transformers with FineGrainedFP8Config
(dynamic and static activations), run through finegemm (FP8 linear layers and the "finegemm" experts
implementation), against two references:

- the whole model: the dequantized bf16 model (the FP8 round trip of the weights, bf16 activations; for the static
  scheme, each quantized layer's input goes through the static scale's quantize-dequantize first), with the routing
  of finegemm's forward pinned in the reference. Bar: logits rel <= 5e-2. The dynamic scheme has two such
  references: the saved checkpoint reloaded with FineGrainedFP8Config(dequantize=True), and the same weights
  dequantized here by hand. The free-running rel (the reference routing for itself) is reported, not asserted:
  a router near a tie may pick another expert for an input that differs by FP8 activation rounding.
- each quantized layer: finegemm's CPU reference (Backend.Reference) on the same quantized tensors and the layer's
  captured input. Bar: RECIPES.md's rel <= 3e-3 (bf16 output).

It also times the forward (CUDA events, median) of the finegemm model and of the dequantized bf16 model, and writes
everything to $OUT/transformers_e2e.json when OUT is set.

Skipped where torch, transformers or a CUDA device (with finegemm built with CUDA) is missing.
"""

import collections
import contextlib
import json
import os
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import finegemm  # noqa: E402
import finegemm.torch as fgt  # noqa: E402
import finegemm.transformers as fgtf  # noqa: E402
from finegemm import ActivationRecipe, Backend, WeightRecipe  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and finegemm.cuda_available()),
    reason="needs a CUDA device and finegemm built with CUDA",
)

FP8_MAX = 448.0
LOGITS_BAR = 5e-2  # issue 6: logits rel vs the dequantized bf16 reference
LAYER_BAR = 3e-3  # RECIPES.md: FP8 x FP8 with bf16 output vs the reference on the same quantized tensors
EXPERTS_BAR = 1e-2  # issue 4: the MoE block vs the reference with the same intermediate quantization
BLOCK = (128, 128)
EVAL_SHAPE = (2, 128)  # [batch, sequence] of the checked forward
TIMING_SHAPES = {"decode_8x1": (8, 1), "prefill_4x256": (4, 256)}
RESULTS = {}


# ---- The model.


def tiny_config():
    from transformers import Qwen3MoeConfig

    # 2 * moe_intermediate_size >= 128: one 128-row scale block per gate/up half (docs/python.md, known limit).
    return Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=512,
        tie_word_embeddings=False,
        hidden_act="silu",
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A bf16 random-weight checkpoint on disk; the seed of this run's random data."""
    if not hasattr(transformers, "FineGrainedFP8Config") or not hasattr(transformers, "Qwen3MoeForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no FineGrainedFP8Config or Qwen3MoeForCausalLM")
    seed = int(time.time_ns() % 2**31)
    print(f"seed {seed}")
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(tiny_config()).to(torch.bfloat16).eval()
    path = tmp_path_factory.mktemp("qwen3moe") / "bf16"
    model.save_pretrained(path)
    del model
    return path, seed


def load(path, **quantization):
    config = transformers.FineGrainedFP8Config(**quantization) if quantization else None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), quantization_config=config, dtype=torch.bfloat16, device_map="cuda"
    )
    return model.eval()


def class_names(module):
    return {cls.__name__ for cls in type(module).__mro__}


def fp8_linears(model):
    """{name: module} of transformers' FP8 linear layers that hold a quantized (1-byte) weight."""
    found = {}
    for name, module in model.named_modules():
        if class_names(module) & set(fgtf._LINEAR_CLASS_NAMES) and fgtf._is_quantized(module.weight):
            found[name] = module
    return found


def fp8_experts(model):
    """{name: module} of transformers' FP8 experts blocks (quantized gate_up)."""
    found = {}
    for name, module in model.named_modules():
        weight = getattr(module, "gate_up_proj", None)
        if isinstance(weight, torch.Tensor) and fgtf._is_quantized(weight) and hasattr(module, "down_proj_scale_inv"):
            found[name] = module
    return found


# ---- Dequantization by hand (plain torch, independent of finegemm).


def dequantize(weight, scale, block_size):
    """weight [..., N, K] float8_e4m3fn with scales [..., ceil(N/bn), ceil(K/bk)] (or a scalar) → float32."""
    q = weight.float()
    s = scale.float()
    if s.numel() == 1:
        return q * s.reshape(())
    n, k = q.shape[-2:]
    bn, bk = block_size
    s = s.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)[..., :k]
    return q * s


def stacked(tensor):
    """[g0, u0, g1, u1, ...] → [gate; up] along the rows."""
    return torch.cat([tensor[..., 0::2, :], tensor[..., 1::2, :]], dim=-2)


def hand_dequantized(path, fp8_model):
    """The bf16 checkpoint's model with every quantized weight replaced by its dequantization from fp8_model."""
    reference = load(path)
    modules = dict(reference.named_modules())
    with torch.no_grad():
        for name, module in fp8_linears(fp8_model).items():
            target = modules[name]
            block = module.block_size or BLOCK
            w = dequantize(module.weight, module.weight_scale_inv, block)
            assert target.weight.shape == w.shape, f"{name}: bf16 {tuple(target.weight.shape)} vs FP8 {tuple(w.shape)}"
            target.weight.copy_(w.to(target.weight.dtype))
        for name, module in fp8_experts(fp8_model).items():
            target = modules[name]
            block = module.block_size or BLOCK
            for proj in ("gate_up_proj", "down_proj"):
                w = dequantize(getattr(module, proj), getattr(module, f"{proj}_scale_inv"), block)
                if proj == "gate_up_proj" and fgtf._gate_up_interleaved(module):
                    w = stacked(w)
                held = getattr(target, proj)
                assert held.shape == w.shape, (
                    f"{name}.{proj}: the bf16 experts hold {tuple(held.shape)}, the FP8 ones {tuple(w.shape)} "
                    f"(this test expects transformers' [E, 2I, H] / [E, H, I] layout)"
                )
                held.copy_(w.to(held.dtype))
    return reference


# ---- Reference forwards.


def quantize_dequantize(x, scale):
    """The static recipe on x: sat(x / s) to e4m3 (round to nearest even), times s."""
    s = scale.float().reshape(())
    return ((x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s).to(x.dtype)


def reference_experts(module, hidden, top_k_index, top_k_weights, act_scales=None, calibration=None):
    """transformers' experts block in float32 from module's float [E, 2I, H] / [E, H, I] weights.

    act_scales: (gate_up [E], down [E]) static scales, applied to each projection's input as quantize-dequantize.
    calibration: a dict that receives per-expert amax of both inputs ("gate_up", "down": [E] float32)."""
    gate_up, down = module.gate_up_proj, module.down_proj
    experts = gate_up.shape[0]
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    amax = torch.full((2, experts), float("nan"), device=hidden.device)
    for e in range(experts):
        token, slot = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        x = hidden[token]
        amax[0, e] = x.float().abs().max()
        if act_scales is not None:
            x = quantize_dequantize(x, act_scales[0][e])
        gate, up = (x.float() @ gate_up[e].float().t()).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        amax[1, e] = h.abs().max()
        if act_scales is not None:
            h = quantize_dequantize(h, act_scales[1][e])
        y = h.float() @ down[e].float().t()
        out.index_add_(0, token, y * top_k_weights[token, slot, None].float())
    if calibration is not None:
        calibration["gate_up"], calibration["down"] = amax[0], amax[1]
    return out.to(hidden.dtype)


def routing_args(args, kwargs):
    """(hidden, top_k_index, top_k_weights) from an experts call, positional or by keyword."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
    return values[0], values[1], values[2]


@contextlib.contextmanager
def hooked(*registrations):
    handles = list(registrations)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def pinned_routing(model, routing):
    """Every experts call of `model` uses the routing recorded in finegemm's forward (by module name)."""
    modules = dict(model.named_modules())
    missing = [name for name in routing if name not in modules]
    assert not missing, f"the reference has no experts module {missing}"

    def pin(name):
        def hook(module, args, kwargs):
            hidden, _, _ = routing_args(args, kwargs)
            _, index, weights = routing[name]
            kwargs = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "top_k_index", "top_k_weights")}
            # Copies: some implementations clamp the indices in place.
            return (hidden, index.clone(), weights.clone()), kwargs

        return hook

    with hooked(*[modules[n].register_forward_pre_hook(pin(n), with_kwargs=True) for n in routing]):
        yield


@contextlib.contextmanager
def static_reference(model, linear_scales, expert_scales):
    """The static scheme's activations in a float model: each quantized linear's input and each expert's two
    projection inputs go through quantize-dequantize with the FP8 model's scales."""
    modules = dict(model.named_modules())

    def qdq_input(scale):
        return lambda module, args: (quantize_dequantize(args[0], scale),) + tuple(args[1:])

    handles = [modules[n].register_forward_pre_hook(qdq_input(s)) for n, s in linear_scales.items()]
    for name, scales in expert_scales.items():
        module = modules[name]
        module.forward = lambda *a, _m=module, _s=scales, **k: reference_experts(_m, *routing_args(a, k), _s)
    try:
        with hooked(*handles):
            yield
    finally:
        for name in expert_scales:
            del modules[name].forward


def calibrate(model, input_ids, linear_names, expert_names):
    """amax / 448 of each quantized layer's inputs in a float forward: {linear: scale}, {experts: (gate_up, down)}."""
    modules = dict(model.named_modules())
    linear_amax, expert_amax = {}, {}

    def record(name):
        def hook(module, args):
            linear_amax[name] = args[0].detach().float().abs().max()

        return hook

    for name in expert_names:
        module = modules[name]

        def forward(*a, _m=module, _n=name, **k):
            expert_amax[_n] = {}
            return reference_experts(_m, *routing_args(a, k), calibration=expert_amax[_n])

        module.forward = forward
    try:
        with hooked(*[modules[n].register_forward_pre_hook(record(n)) for n in linear_names]), torch.no_grad():
            model(input_ids=input_ids, use_cache=False)
    finally:
        for name in expert_names:
            del modules[name].forward
    linear_scales = {n: (a / FP8_MAX).reshape(()) for n, a in linear_amax.items()}
    expert_scales = {}
    for name, amax in expert_amax.items():
        pair = []
        for key in ("gate_up", "down"):
            values = amax[key]
            values = torch.where(torch.isnan(values), values.nan_to_num(0.0).max(), values)  # unrouted experts
            pair.append((values / FP8_MAX).float())
        expert_scales[name] = tuple(pair)
    return linear_scales, expert_scales


def set_parameter(module, name, value):
    """Replace module.<name> by `value` (float32, on the module's device), keeping the parameter's shape."""
    held = getattr(module, name, None)
    assert held is not None, f"{type(module).__name__}.{name} is missing: the static scheme holds it"
    device = next(t.device for t in module.parameters() if t.device.type != "meta")
    value = value.to(device=device, dtype=torch.float32).reshape(held.shape)
    setattr(module, name, torch.nn.Parameter(value.clone(), requires_grad=False))


# ---- finegemm's forward, recorded.


class CountingExt:
    """finegemm._ext with its linear / moe_experts calls counted (the custom ops call through finegemm.torch._ext)."""

    def __init__(self, ext):
        self._ext = ext
        self.calls = collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._ext, name)
        if name not in ("linear", "moe_experts"):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


def recorded_forward(model, input_ids, monkeypatch):
    """logits, {linear name: (x, y)}, {experts name: (hidden, index, weights, y)}, finegemm call counts."""
    linears, experts = fp8_linears(model), fp8_experts(model)
    linear_io, experts_in, experts_io = {}, {}, {}

    def on_linear(name):
        def hook(module, args, output):
            linear_io[name] = (args[0].detach().clone(), output.detach().clone())

        return hook

    def before_experts(name):
        def hook(module, args, kwargs):
            experts_in[name] = tuple(t.detach().clone() for t in routing_args(args, kwargs))

        return hook

    def after_experts(name):
        def hook(module, args, kwargs, output):
            experts_io[name] = experts_in[name] + (output.detach().clone(),)

        return hook

    handles = [m.register_forward_hook(on_linear(n)) for n, m in linears.items()]
    handles += [m.register_forward_pre_hook(before_experts(n), with_kwargs=True) for n, m in experts.items()]
    handles += [m.register_forward_hook(after_experts(n), with_kwargs=True) for n, m in experts.items()]
    counting = CountingExt(fgt._ext)
    with monkeypatch.context() as patch, hooked(*handles), torch.no_grad():
        patch.setattr(fgt, "_ext", counting)
        logits = model(input_ids=input_ids, use_cache=False).logits
    return logits, linear_io, experts_io, counting.calls


# ---- Comparisons.


def rel(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "non-finite values in finegemm's output"
    return ((out - ref).norm() / ref.norm()).item()


def logits_of(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits


def layer_errors(model, linear_io, experts_io, scheme):
    """rel of each quantized layer's finegemm output vs finegemm's CPU reference on its captured input."""
    weight_recipe = WeightRecipe.block(*BLOCK)
    act = ActivationRecipe.static_per_tensor() if scheme == "static" else ActivationRecipe.per_token_group(BLOCK[1])
    modules = dict(model.named_modules())
    errors = {}
    for name, (x, y) in linear_io.items():
        module = modules[name]
        k = x.shape[-1]
        x2 = x.reshape(-1, k).float().cpu()
        ref = torch.empty(x2.shape[0], module.weight.shape[0], dtype=torch.float32)
        x_scale = module.activation_scale.detach().float().cpu().reshape(()) if scheme == "static" else None
        bias = module.bias.detach().float().cpu() if module.bias is not None else None
        finegemm.linear(x2, module.weight.detach().cpu(), module.weight_scale_inv.detach().cpu(),
                        weight_recipe=weight_recipe, activation=act, x_scale=x_scale, bias=bias, out=ref,
                        backend=Backend.Reference)
        errors[name] = rel(y.reshape(ref.shape), ref)
    for name, (hidden, index, weights, y) in experts_io.items():
        module = modules[name]
        extra = {}
        if scheme == "static":
            extra = dict(gate_up_act_scale=module.gate_up_proj_activation_scale.detach().float().cpu(),
                         down_act_scale=module.down_proj_activation_scale.detach().float().cpu())
        ref = torch.empty(hidden.shape, dtype=torch.float32)
        finegemm.moe_experts(hidden.float().cpu(), index.cpu(), weights.float().cpu(),
                             module.gate_up_proj.detach().cpu(), module.gate_up_proj_scale_inv.detach().cpu(),
                             module.down_proj.detach().cpu(), module.down_proj_scale_inv.detach().cpu(),
                             weight_recipe=weight_recipe, activation_recipe=act,
                             interleaved_gate_up=fgtf._gate_up_interleaved(module), out=ref,
                             backend=Backend.Reference, **extra)
        errors[name] = rel(y, ref)
    return errors


def forward_ms(model, input_ids, warmup=3, repeats=10):
    """Median forward time in ms (CUDA events around each forward, after warm-up)."""
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(input_ids=input_ids, use_cache=False)
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(input_ids=input_ids, use_cache=False)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def timings(fp8_model, bf16_model, vocab):
    result = {}
    for label, shape in TIMING_SHAPES.items():
        ids = torch.randint(0, vocab, shape, device="cuda")
        ours, theirs = forward_ms(fp8_model, ids), forward_ms(bf16_model, ids)
        result[label] = {"finegemm_ms": round(ours, 4), "bf16_dequantized_ms": round(theirs, 4),
                         "bf16_over_finegemm": round(theirs / ours, 3)}
    return result


def write_results(scheme, entry):
    RESULTS[scheme] = entry
    out = os.environ.get("OUT")
    if not out:
        return
    path = os.path.join(out, "transformers_e2e.json")
    document = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "finegemm_commit": os.environ.get("FINEGEMM_COMMIT", "unknown"),
        "schemes": dict(RESULTS),
    }
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(document, f, indent=2)


# ---- The test.


@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_tiny_qwen3_moe_through_finegemm(checkpoint, scheme, tmp_path, monkeypatch):
    path, seed = checkpoint
    vocab = tiny_config().vocab_size
    input_ids = torch.randint(0, vocab, EVAL_SHAPE, device="cuda")

    model = load(path, activation_scheme=scheme)
    linears, experts = fp8_linears(model), fp8_experts(model)
    assert linears and experts, (
        f"transformers quantized {len(linears)} linear layers and {len(experts)} experts blocks: expected both"
    )

    references = {}
    references_skipped = {}
    if scheme == "dynamic":
        # Saved before finegemm touches the layout (prepare() restacks gate/up in place).
        model.save_pretrained(tmp_path / "fp8")
        try:
            references["dequantize=True"] = load(tmp_path / "fp8", dequantize=True)
            assert not fp8_linears(references["dequantize=True"]), "dequantize=True left FP8 layers"
        except RuntimeError as e:
            # NOTE: transformers 5.17 on the H200 machine could not reload its own FP8 experts with dequantize=True
            # ("shape '[256, 128]' is invalid for input of size 65536" in Fp8Dequantize): the hand-dequantized
            # reference below stands in, and the JSON says why.
            references_skipped["dequantize=True"] = str(e).splitlines()[0][:200]

    fgtf.enable(model)
    if getattr(model.config, "_experts_implementation", "finegemm") != "finegemm":
        model.set_experts_implementation("finegemm")
    references["hand"] = hand_dequantized(path, model)

    linear_scales, expert_scales = {}, {}
    if scheme == "static":
        # transformers quantizes weights on load but has no calibration data for the input scales: set them from
        # a calibration forward of the dequantized model (amax / 448), as a calibrated checkpoint would ship them.
        linear_scales, expert_scales = calibrate(references["hand"], input_ids, list(linears), list(experts))
        for name, module in linears.items():
            set_parameter(module, "activation_scale", linear_scales[name])
        for name, module in experts.items():
            set_parameter(module, "gate_up_proj_activation_scale", expert_scales[name][0])
            set_parameter(module, "down_proj_activation_scale", expert_scales[name][1])
        # The reference reads the scales back from the model: the very values finegemm runs with.
        linear_scales = {n: m.activation_scale.detach().reshape(()) for n, m in linears.items()}
        expert_scales = {n: (m.gate_up_proj_activation_scale.detach(), m.down_proj_activation_scale.detach())
                         for n, m in experts.items()}

    logits, linear_io, experts_io, calls = recorded_forward(model, input_ids, monkeypatch)
    # Every quantized layer ran through finegemm, once.
    assert calls["moe_experts"] == len(experts), f"finegemm moe_experts calls: {calls}, experts blocks {len(experts)}"
    assert calls["linear"] == len(linears), f"finegemm linear calls: {calls}, FP8 linear layers {len(linears)}"
    assert set(linear_io) == set(linears) and set(experts_io) == set(experts)

    # Per layer: finegemm vs its CPU reference on the same quantized tensors and inputs.
    errors = layer_errors(model, linear_io, experts_io, scheme)
    worst = max(errors, key=errors.get)

    # The whole model: logits vs the dequantized bf16 references, finegemm's routing pinned.
    routing = {name: (hidden, index, weights) for name, (hidden, index, weights, _) in experts_io.items()}
    pinned, free = {}, {}
    for label, reference in references.items():
        with contextlib.ExitStack() as stack:
            if scheme == "static":
                stack.enter_context(static_reference(reference, linear_scales, expert_scales))
            free[label] = rel(logits, logits_of(reference, input_ids))
            stack.enter_context(pinned_routing(reference, routing))
            pinned[label] = rel(logits, logits_of(reference, input_ids))

    entry = {
        "seed": seed,
        "tokens": EVAL_SHAPE[0] * EVAL_SHAPE[1],
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
        "finegemm_calls_per_forward": dict(calls),
        "logits_rel_pinned_routing": {k: round(v, 6) for k, v in pinned.items()},
        "logits_rel_free_routing": {k: round(v, 6) for k, v in free.items()},
        "layer_rel": {k: round(v, 6) for k, v in errors.items()},
        "max_layer_rel": round(errors[worst], 6),
        "references_skipped": references_skipped,
        "forward": timings(model, references.get("dequantize=True", references["hand"]), vocab),
    }
    write_results(scheme, entry)
    print(json.dumps(entry, indent=2))

    for name, value in errors.items():
        bar = EXPERTS_BAR if name.endswith("experts") else LAYER_BAR
        assert value <= bar, f"{name}: rel {value:.3e} vs finegemm's CPU reference (seed {seed}), bar {bar:.0e}"
    for label, value in pinned.items():
        assert value <= LOGITS_BAR, (
            f"logits rel {value:.3e} vs the {label} dequantized reference with pinned routing "
            f"(free routing: {free[label]:.3e}; seed {seed})"
        )
