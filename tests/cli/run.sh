#!/usr/bin/env bash
# `finegemm run`: the synthetic MoE block runs in every recipe on the CPU within tolerance of the reference; then
# a small generated bf16 model is quantized (`finegemm quantize`) and its layers run with `run --checkpoint`.
# Usage: run.sh FINEGEMM_BINARY SCRATCH_DIR
set -euo pipefail
bin=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch"
# NOTE: ctest runs tests side by side on two cores; spinning OpenMP workers then starve each other (50× slower).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

fail() {
  echo "FAIL: $*"
  exit 1
}

echo "== finegemm run --backend cpu --json"
status=0
"$bin" run --backend cpu --json >"$scratch/run.json" 2>"$scratch/run.err" || status=$?
[ "$status" -eq 0 ] || { cat "$scratch/run.err" "$scratch/run.json"; fail "finegemm run exited $status"; }
python3 - "$scratch/run.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
rows = report["results"]
assert report["ok"] is True and report["backend"] == "cpu", (report["ok"], report["backend"])
assert len(rows) >= 16, f"expected every recipe (16), got {len(rows)} rows"
names = {r["recipe"] for r in rows}
for needed in ["block128x128/fp32 x group128", "block128x128/ue8m0 x group128-pow2", "block128x128/fp32 x static",
               "channel/fp32 x token", "tensor/fp32 x static", "mxfp4/ue8m0 x group32"]:
    assert needed in names, f"recipe {needed} missing from the run: {sorted(names)}"
for r in rows:
    assert r["ok"], f"{r['recipe']}: {r.get('error', r.get('rel_error'))}"
    assert r["rel_error"] is not None and r["rel_error"] <= r["tolerance"], r
    assert r["tokens"] == report["shape"]["tokens"] and r["ms"] > 0 and r["gflops"] > 0, r
    assert 1 <= r["checked_tokens"] <= r["tokens"], r
s = report["shape"]
print(f"ok: {len(rows)} recipes, T={s['tokens']} H={s['hidden']} I={s['intermediate']} E={s['experts']} "
      f"top-{s['top_k']}, max rel error {max(r['rel_error'] for r in rows):.2e}, {report['seconds']:.1f} s")
PY

# Human-readable output: one row per recipe, and an "ok" verdict.
"$bin" run --backend cpu --tokens 16 --iters 1 --seed 7 >"$scratch/run.txt"
grep -q "16/16 recipes within" "$scratch/run.txt" || grep -q "recipes within" "$scratch/run.txt" || fail "no verdict line in: $(cat "$scratch/run.txt")"
grep -q "^block128x128/fp32 x group128 .* ok$" "$scratch/run.txt" || fail "no ok row for block128x128/fp32 x group128"
echo "ok: table output"

# Bad invocations.
expect_error() {
  local pattern=$1
  shift
  local status=0
  "$bin" "$@" >"$scratch/bad.out" 2>"$scratch/bad.err" || status=$?
  [ "$status" -ne 0 ] || fail "'finegemm $*' exited 0"
  grep -qF -- "$pattern" "$scratch/bad.err" || { cat "$scratch/bad.err"; fail "'finegemm $*' did not say: $pattern"; }
  echo "ok: 'finegemm $*' exits $status: $(head -n1 "$scratch/bad.err")"
}
expect_error "--tokens: expected an integer in [1, " run --tokens 0
expect_error "--backend: expected one of auto|cpu|cuda|ref|reference, got 'gpu'" run --backend gpu
expect_error "--layer: needs --checkpoint DIR" run --layer model.layers.0.mlp.down_proj

# ---- Checkpoints: quantize a small generated model, then run its layers.
if ! "$bin" quantize --help >/dev/null 2>&1; then
  echo "SKIP: checkpoint runs (this finegemm has no quantize command yet)"
  exit 0
fi
python3 - "$scratch/model" <<'PY'
# A tiny DeepSeek-V3-like bf16 model: one dense MLP projection (N = 320, not a multiple of 128) and one experts
# block in transformers' fused layout, plus the tensors a quantizer must leave alone. Calibration samples too.
import json, os, random, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(1234)

def tensor(shape, std, dtype="BF16"):
    n = 1
    for s in shape:
        n *= s
    vals = [rng.gauss(0.0, std) for _ in range(n)]
    raw = struct.pack(f"<{n}f", *vals)
    if dtype == "BF16":  # keep the high half of each float32
        raw = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    return dtype, shape, raw

def save(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

H, I, E = 256, 128, 8
save(os.path.join(out, "model.safetensors"), {
    "model.embed_tokens.weight": tensor([64, H], 1.0),
    "model.layers.0.mlp.down_proj.weight": tensor([320, 512], 512 ** -0.5),
    "model.layers.1.mlp.gate.weight": tensor([E, H], H ** -0.5),
    "model.layers.1.mlp.experts.gate_up_proj": tensor([E, 2 * I, H], H ** -0.5),
    "model.layers.1.mlp.experts.down_proj": tensor([E, H, I], I ** -0.5),
    "model.norm.weight": tensor([H], 1.0),
})
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": H,
               "moe_intermediate_size": I, "n_routed_experts": E, "num_experts_per_tok": 4, "hidden_act": "silu",
               "torch_dtype": "bfloat16"}, f)
save(os.path.join(out, "calib.safetensors"), {
    "model.layers.0.mlp.down_proj": tensor([16, 512], 1.0, "F32"),
    "model.layers.1.mlp.experts.gate_up_proj": tensor([16, H], 1.0, "F32"),
    "model.layers.1.mlp.experts.down_proj": tensor([16, I], 0.3, "F32"),
})
PY
mv "$scratch/model/calib.safetensors" "$scratch/calib.safetensors"

run_layers() {  # $1: checkpoint dir, $2: expected weight recipe name
  local ckpt=$1 recipe=$2 layer
  for layer in "" model.layers.0.mlp.down_proj model.layers.1.mlp.experts; do
    local args=(run --checkpoint "$ckpt" --backend cpu --tokens 20 --iters 1 --json)
    [ -n "$layer" ] && args+=(--layer "$layer")
    status=0
    "$bin" "${args[@]}" >"$scratch/ckpt.json" 2>"$scratch/ckpt.err" || status=$?
    [ "$status" -eq 0 ] || { cat "$scratch/ckpt.err" "$scratch/ckpt.json"; fail "finegemm ${args[*]} exited $status"; }
    python3 - "$scratch/ckpt.json" "$recipe" "$layer" <<'PY'
import json, sys
report, recipe, layer = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
row = report["results"][0]
assert report["ok"] and row["ok"], row
assert row["recipe"].startswith(recipe), f"expected recipe {recipe}..., got {row['recipe']}"
assert not layer or report["layer"] == layer, (report["layer"], layer)
assert row["tokens"] == 20 and row["rel_error"] <= row["tolerance"], row
print(f"ok: {report['layer']} ({report['shape']}) as {row['recipe']}: rel error {row['rel_error']:.2e}")
PY
  done
}

for recipe in "block128 dynamic float block128x128/fp32 x group128" \
              "block128 static ue8m0 block128x128/ue8m0 x static" \
              "mxfp4 dynamic ue8m0 mxfp4/ue8m0"; do
  read -r weights acts fmt name <<<"$recipe"
  out="$scratch/q-$weights-$acts"
  echo "== finegemm quantize --weights $weights --activations $acts --scale-fmt $fmt"
  qargs=(quantize "$scratch/model" "$out" --weights "$weights" --activations "$acts" --scale-fmt "$fmt")
  [ "$acts" = static ] && qargs+=(--calib "$scratch/calib.safetensors")
  "$bin" "${qargs[@]}" >"$scratch/quantize.out" 2>&1 || { cat "$scratch/quantize.out"; fail "finegemm ${qargs[*]}"; }
  run_layers "$out" "$name"
done
expect_error "model.layers.9.nothing" run --checkpoint "$scratch/q-block128-dynamic" --layer model.layers.9.nothing
echo "ok: cli.run"
