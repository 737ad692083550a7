#!/usr/bin/env bash
# `finegemm check --backend cpu --json`: every recipe of RECIPES.md × {linear, moe_experts} runs on the CPU fast path
# within tolerance of the reference; bad invocations fail with a clear message.
# Usage: check.sh FINEGEMM_BINARY SCRATCH_DIR
set -euo pipefail
bin=$1
scratch=$2
mkdir -p "$scratch"
# NOTE: ctest runs tests side by side on two cores; spinning OpenMP workers then starve each other (50× slower).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

echo "== finegemm check --backend cpu --json"
status=0
"$bin" check --backend cpu --json >"$scratch/check.json" 2>"$scratch/check.err" || status=$?
if [ "$status" -ne 0 ]; then
  echo "FAIL: finegemm check exited $status"
  cat "$scratch/check.err"
  python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    if not r["ok"]: print("  not ok:", r["recipe"], r["op"], r["variant"], r["backend"], r["rel_error"], r.get("error", ""))' \
    "$scratch/check.json" || true
  exit 1
fi

python3 - "$scratch/check.json" <<'PY'
import json, sys

report = json.load(open(sys.argv[1]))
results = report["results"]
assert report["ok"] is True, "top-level ok is not true"
assert report["backends"] == ["cpu"], f"expected backends ['cpu'], got {report['backends']}"

bad = [r for r in results if not r["ok"] or r["rel_error"] is None or r["rel_error"] > r["tolerance"]]
assert not bad, "rows not ok: " + "; ".join(f"{r['recipe']} {r['op']} {r['variant']}: {r.get('error', r['rel_error'])}" for r in bad)

# Every recipe has both ops.
ops = {}
for r in results:
    ops.setdefault(r["recipe"], set()).add(r["op"])
missing = {name: {"linear", "moe_experts"} - got for name, got in ops.items() if {"linear", "moe_experts"} - got}
assert not missing, f"recipes without both ops: {missing}"

# The recipes RECIPES.md lists are all there (weight recipe, activation recipe).
weights = {r["weight"] for r in results}
activations = {r["activation"] for r in results}
pairs = {(r["weight"], r["activation"]) for r in results}
for w in ["block128x128/fp32", "block128x128/ue8m0", "block128x128/ue8m0x4", "block64x128/fp32", "block32x32/fp32",
          "channel/fp32", "tensor/fp32", "mxfp4/ue8m0", "mxfp4/fp32"]:
    assert w in weights, f"weight recipe {w} is not checked (checked: {sorted(weights)})"
for a in ["group128", "group128-pow2", "group32", "token", "static"]:
    assert a in activations, f"activation recipe {a} is not checked (checked: {sorted(activations)})"
for p in [("block128x128/fp32", "static"), ("block128x128/ue8m0", "group128-pow2"), ("channel/fp32", "token"),
          ("tensor/fp32", "static"), ("mxfp4/ue8m0", "group32"), ("mxfp4/ue8m0", "static")]:
    assert p in pairs, f"recipe {p[0]} x {p[1]} is not checked"

# The MoE variants: gated, no gate, GPT-OSS with limit 7.
variants = {r["variant"] for r in results if r["op"] == "moe_experts"}
assert any("no gate" in v for v in variants), f"no no-gate MoE variant in {variants}"
assert any(v.startswith("swiglu-oai L=7") for v in variants), f"no GPT-OSS MoE variant in {variants}"

# Each row's numbers are plausible: a real error, not an exact copy of the reference.
for r in results:
    assert 0 <= r["rel_error"] and r["non_finite"] == 0, r

print(f"ok: {len(ops)} recipes x {{linear, moe_experts}}, {len(results)} rows, all within tolerance "
      f"(seed {report['seed']}, {report['seconds']:.1f} s)")
PY

# Bad invocations: non-zero exit and a message that says what was wrong.
expect_error() {
  local pattern=$1
  shift
  local status=0
  "$bin" "$@" >"$scratch/bad.out" 2>"$scratch/bad.err" || status=$?
  if [ "$status" -eq 0 ]; then
    echo "FAIL: 'finegemm $*' exited 0"
    exit 1
  fi
  if ! grep -qF -- "$pattern" "$scratch/bad.err"; then
    echo "FAIL: 'finegemm $*' (exit $status) did not say: $pattern"
    echo "stderr was:"
    cat "$scratch/bad.err"
    exit 1
  fi
  echo "ok: 'finegemm $*' exits $status: $(head -n1 "$scratch/bad.err")"
}
expect_error "--backend: expected one of cpu|cuda|all, got 'tpu'" check --backend tpu
expect_error "unknown option '--frobnicate'" check --frobnicate
expect_error "--seed: expected a non-negative integer, got 'abc'" check --seed abc
expect_error "--backend: expected a value" check --backend
expect_error "unknown command 'chek'" chek
if [ "$("$bin" --version | head -n1 | cut -d' ' -f1)" != finegemm ]; then
  echo "FAIL: finegemm --version"
  exit 1
fi
"$bin" check --help | grep -q "usage: finegemm check"
echo "ok: cli.check"
