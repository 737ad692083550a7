"""`finegemm quantize` output loads in transformers with its FineGrainedFP8Config fields.

Builds a tiny random bf16 Llama, saves it, quantizes it with the finegemm program (block128, dynamic and static
with a calibration file), and loads the result with transformers. On a machine without a GPU transformers
dequantizes FP8 checkpoints on load, which still reads every key finegemm wrote (weight, weight_scale_inv,
activation_scale) and the quantization_config. Checks: no missing or unexpected keys, the dequantized weights equal
finegemm's own dequantization, and the logits stay close to the bf16 model's.

Needs torch and transformers (skipped otherwise) and the finegemm binary (FINEGEMM_BIN or build/tools/finegemm).
"""
import json
import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("FINEGEMM_BIN", ROOT / "build" / "tools" / "finegemm"))


def tiny_llama(path):
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      dtype="bfloat16")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return model


def load_quantized(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype=torch.bfloat16)


@pytest.mark.skipif(not BIN.exists(), reason=f"finegemm binary not found at {BIN}")
@pytest.mark.parametrize("scheme", ["dynamic", "static"])
def test_quantized_checkpoint_loads_in_transformers(tmp_path, scheme):
    src, dst = tmp_path / "bf16", tmp_path / f"fp8-{scheme}"
    model = tiny_llama(src)
    cmd = [str(BIN), "quantize", str(src), str(dst), "--weights", "block128", "--activations", scheme, "--json"]
    if scheme == "static":
        # Calibration activations per layer: the inputs of every linear, from one forward of the bf16 model.
        from safetensors.torch import save_file
        calib, hooks = {}, []
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
                hooks.append(mod.register_forward_hook(
                    lambda m, i, o, name=name: calib.__setitem__(name, i[0].reshape(-1, i[0].shape[-1]).float().contiguous())))
        with torch.no_grad():
            model(torch.randint(0, 512, (2, 16)))
        for h in hooks:
            h.remove()
        save_file(calib, str(tmp_path / "calib.safetensors"))
        cmd += ["--calib", str(tmp_path / "calib.safetensors")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["activation_scheme"] == scheme and qc["weight_block_size"] == [128, 128]

    loaded, info = load_quantized(dst)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info.get("mismatched_keys"), info.get("mismatched_keys")

    # The weights transformers ends up with equal finegemm's dequantization of what it wrote.
    from safetensors import safe_open
    files = sorted(dst.glob("*.safetensors"))
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                tensors[k] = h.get_tensor(k)
    name = "model.layers.0.mlp.down_proj"
    q, s = tensors[name + ".weight"].float(), tensors[name + ".weight_scale_inv"].float()
    deq = q * s.repeat_interleave(128, 0)[: q.shape[0]].repeat_interleave(128, 1)[:, : q.shape[1]]
    got = dict(loaded.named_parameters()).get(name + ".weight")
    if got is not None and got.dtype != torch.float8_e4m3fn:
        rel = ((got.float() - deq).norm() / deq.norm()).item()
        assert rel < 1e-2, rel  # bf16 rounding of the dequantized weight
    if scheme == "static":
        assert (name + ".activation_scale") in tensors or (name + ".input_scale") in tensors

    # Logits close to the bf16 model's (FP8 weights: a few percent).
    ids = torch.randint(0, 512, (1, 12))
    with torch.no_grad():
        ref = model(ids).logits.float()
        try:
            got_logits = loaded(ids).logits.float()
        except Exception as e:  # noqa: BLE001 — transformers' FP8 forward may need kernels a CPU machine lacks
            pytest.skip(f"transformers could load but not run the FP8 model here: {type(e).__name__}: {e}")
    rel = ((got_logits - ref).norm() / ref.norm()).item()
    print(f"{scheme}: transformers {transformers.__version__} loaded {len(tensors)} tensors, "
          f"quantization_config {qc}, logits rel {rel:.3e} vs the bf16 model")
    assert rel < 0.1, rel
