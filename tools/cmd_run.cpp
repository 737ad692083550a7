// finegemm run: a synthetic DeepSeek-V3-shaped MoE block in every recipe, or one layer of a checkpoint;
// timed, and checked against the CPU reference.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "finegemm/checkpoint.hpp"
#include "finegemm/finegemm.hpp"

namespace finegemm::tools {
namespace {

constexpr double kLinearTolerance = 3e-3;  // bf16 output (RECIPES.md)
constexpr double kMoeTolerance = 1e-2;
// The reference runs in double with plain loops: it checks at most this many FLOPs' worth of tokens.
// NOTE: 5e7 checked 15 tokens of the synthetic block; the requantized MoE intermediate then gave rel 2e-3..1.02e-2
// over fresh seeds on the H200 (a flipped E4M3 code moves a whole output row): 2e8 checks 60 tokens.
constexpr double kReferenceFlopBudget = 2e8;

struct Row {
  std::string recipe, layer;
  int64_t tokens = 0, checked_tokens = 0;
  double seconds = 0, flops = 0, rel = 0, tolerance = 0;
  int64_t non_finite = 0;
  bool ok = false;
  std::string error;
};

// Warm-up, then the median of `iters` timed runs.
double median_seconds(const std::function<void()>& body, DeviceRun& run, int64_t iters) {
  body();
  run.sync();
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    run.sync();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int64_t reference_tokens(int64_t tokens, double flops_per_token) {
  return std::clamp<int64_t>(static_cast<int64_t>(kReferenceFlopBudget / std::max(flops_per_token, 1.0)), 1, tokens);
}

void check_moe(const MoeArgs& host_args, const HostTensor& out, Row& row) {
  HostTensor ref(DType::F32, {row.checked_tokens, host_args.hidden.size(1)});
  poison(ref.view);
  MoeArgs ref_args = first_tokens(host_args, row.checked_tokens);
  ref_args.out = ref.view;
  moe_experts(ref_args, {Backend::Reference});
  const Comparison cmp = compare(out.view, ref.view, row.checked_tokens);
  // Every output element must have been written, not only the checked rows.
  row.non_finite = compare(out.view, out.view).non_finite;
  row.rel = cmp.rel;
  row.ok = row.non_finite == 0 && cmp.ok(row.tolerance);
}

void print_rows(const std::vector<Row>& rows, bool show_layer) {
  std::vector<std::string> headers{"recipe"};
  std::vector<bool> right{false};
  if (show_layer) headers.push_back("layer"), right.push_back(false);
  for (const char* h : {"tokens", "ms", "tokens/s", "GFLOP/s", "rel error", "checked", "ok"}) headers.push_back(h);
  for (int i = 0; i < 6; ++i) right.push_back(true);
  right.push_back(false);
  Table table(headers, right);
  for (const auto& r : rows) {
    std::vector<std::string> cells{r.recipe};
    if (show_layer) cells.push_back(r.layer);
    if (!r.error.empty()) {
      for (int i = 0; i < 6; ++i) cells.push_back("-");
      cells.push_back("error");
    } else {
      cells.push_back(std::to_string(r.tokens));
      cells.push_back(format_double(r.seconds * 1e3, r.seconds < 0.01 ? 2 : 1));
      cells.push_back(format_double(r.tokens / r.seconds, 0));
      cells.push_back(format_double(r.flops / r.seconds * 1e-9, 1));
      cells.push_back(r.non_finite ? std::to_string(r.non_finite) + " NaN/Inf" : format_sci(r.rel));
      cells.push_back(std::to_string(r.checked_tokens));
      cells.push_back(r.ok ? "ok" : "FAIL");
    }
    table.add(cells);
  }
  table.print(stdout);
  for (const auto& r : rows)
    if (!r.error.empty()) std::printf("\nerror: %s: %s", r.recipe.c_str(), r.error.c_str());
}

nlohmann::json rows_json(const std::vector<Row>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json j = {{"recipe", r.recipe}, {"tokens", r.tokens}, {"ok", r.ok}, {"tolerance", r.tolerance}};
    if (!r.layer.empty()) j["layer"] = r.layer;
    if (r.error.empty()) {
      j["ms"] = r.seconds * 1e3;
      j["tokens_per_s"] = r.tokens / r.seconds;
      j["gflops"] = r.flops / r.seconds * 1e-9;
      j["rel_error"] = r.non_finite ? nlohmann::json() : nlohmann::json(r.rel);
      j["non_finite"] = r.non_finite;
      j["checked_tokens"] = r.checked_tokens;
    } else {
      j["error"] = r.error;
    }
    out.push_back(j);
  }
  return out;
}

std::string threads_note(Backend backend) {
  if (backend == Backend::Cuda) return "";
  return " (" + std::to_string(omp_get_max_threads()) + " threads)";
}

// ---- No checkpoint: every recipe on a synthetic DeepSeek-V3-shaped block.
int run_synthetic(Backend backend, int64_t tokens, int64_t iters, uint64_t seed, bool json) {
  MoeProblem problem;
  // NOTE: DeepSeek-V3's block (H=7168, I=2048, top-8 of 256) scaled down to H=512, I=128, top-8 of 32, so that
  // quantizing, running and checking all 16 recipes takes a few seconds on two cores (H=1024, I=256: ~40 s,
  // most of it quantizing the weights and running the double-precision reference).
  problem.hidden = 512;
  problem.inter = 128;
  problem.experts = 32;
  problem.top_k = 8;
  problem.tokens = tokens;
  problem.skip_slots = false;
  std::mt19937_64 rng(seed);
  const MoeMasters masters = make_moe_masters(rng, problem);
  const auto recipes = all_recipes();

  std::vector<Row> rows;
  const auto start = std::chrono::steady_clock::now();
  {
    Progress progress("run", static_cast<int64_t>(recipes.size()));
    for (const auto& recipe : recipes) {
      progress.step(recipe.name);
      Row row;
      row.recipe = recipe.name;
      row.tokens = tokens;
      row.tolerance = kMoeTolerance;
      try {
        std::mt19937_64 input_rng(seed + 1);  // the same tokens and routing in every recipe
        MoeData data = make_moe(input_rng, recipe, problem, masters);
        HostTensor out(DType::BF16, {tokens, problem.hidden});
        const MoeArgs args = data.args(out.view);
        poison(out.view);
        DeviceRun run(backend);
        const MoeArgs device_args = run.upload(args);
        row.seconds = median_seconds([&] { moe_experts(device_args, {backend}); }, run, iters);
        run.download(device_args.out, out.view);
        row.flops = static_cast<double>(data.active_slots) * problem.flops_per_slot();
        row.checked_tokens = reference_tokens(tokens, problem.flops_per_slot() * problem.top_k);
        check_moe(args, out, row);
      } catch (const Error& e) {
        row.error = e.what();
      }
      rows.push_back(row);
    }
  }
  const double elapsed = seconds_since(start);
  int64_t failures = 0;
  for (const auto& r : rows) failures += !r.ok;

  if (json) {
    nlohmann::json out = {{"mode", "synthetic"},
                          {"backend", backend_name(backend)},
                          {"shape",
                           {{"tokens", tokens},
                            {"hidden", problem.hidden},
                            {"intermediate", problem.inter},
                            {"experts", problem.experts},
                            {"top_k", problem.top_k},
                            {"activation", problem.variant()}}},
                          {"iters", iters},
                          {"seed", seed},
                          {"results", rows_json(rows)},
                          {"seconds", elapsed},
                          {"ok", failures == 0}};
    std::printf("%s\n", out.dump(2).c_str());
    return failures ? 1 : 0;
  }
  std::printf("finegemm run: a DeepSeek-V3-shaped MoE block (SwiGLU, top-%lld of %lld experts, H=%lld, I=%lld)\n",
              static_cast<long long>(problem.top_k), static_cast<long long>(problem.experts),
              static_cast<long long>(problem.hidden), static_cast<long long>(problem.inter));
  std::printf("in each of %zu recipes, %lld random tokens, on %s%s; median of %lld runs\n\n", recipes.size(),
              static_cast<long long>(tokens), backend_name(backend), threads_note(backend).c_str(),
              static_cast<long long>(iters));
  print_rows(rows, false);
  std::printf("\n%s: %zu/%zu recipes within %.0e of the CPU reference (double accumulation, first %lld tokens) in "
              "%.1f s\n",
              failures ? "FAIL" : "ok", rows.size() - failures, rows.size(), kMoeTolerance,
              static_cast<long long>(rows.empty() ? 0 : rows.front().checked_tokens), elapsed);
  if (backend != Backend::Cuda && !cuda_available())
    std::printf("(no CUDA device here: on a Hopper GPU, `finegemm run --backend cuda` runs the CUDA backend)\n");
  return failures ? 1 : 0;
}

// ---- A checkpoint's layer.
std::string available_layers(const Checkpoint& ckpt) {
  std::string list;
  int shown = 0;
  for (const auto& names : {ckpt.linear_layers(), ckpt.experts_layers()})
    for (const auto& n : names)
      if (shown++ < 8) list += "\n  " + n;
  if (shown > 8) list += "\n  ... (" + std::to_string(shown - 8) + " more)";
  return list.empty() ? " none" : list;
}

int run_checkpoint(const std::string& path, std::string layer, Backend backend, int64_t tokens, int64_t iters,
                   uint64_t seed, bool json) {
  const Checkpoint ckpt = Checkpoint::open(path);
  const auto linears = ckpt.linear_layers(), experts = ckpt.experts_layers();
  if (layer.empty()) {
    if (!linears.empty()) layer = linears.front();
    else if (!experts.empty()) layer = experts.front();
    else throw Error("--checkpoint: expected quantized layers (FP8/FP4 weights with scales) in " + path + ", found none");
  }
  if (layer.size() > 7 && layer.compare(layer.size() - 7, 7, ".weight") == 0) layer.resize(layer.size() - 7);
  const bool is_experts = std::find(experts.begin(), experts.end(), layer) != experts.end();
  const bool is_linear = std::find(linears.begin(), linears.end(), layer) != linears.end();
  if (!is_experts && !is_linear)
    throw Error("--layer: expected a quantized layer of " + path + ", got '" + layer + "'; the checkpoint has:" +
                available_layers(ckpt));

  std::mt19937_64 rng(seed);
  Row row;
  row.layer = layer;
  row.tokens = tokens;
  std::string shape;
  Progress progress("run", 2);
  try {
    if (is_linear) {
      const LinearLayer l = ckpt.linear(layer);
      row.recipe = l.weight_recipe.name() + " x " + l.activation_recipe.name();
      row.tolerance = kLinearTolerance;
      shape = "linear N=" + std::to_string(l.n) + " K=" + std::to_string(l.k);
      HostTensor x = random_normal(rng, DType::BF16, {tokens, l.k}, 1.0f);
      HostTensor out(DType::BF16, {tokens, l.n});
      LinearArgs args;
      args.x = x.view;
      args.x_scale = l.act_scale;
      args.activation = l.activation_recipe;
      args.weight = l.weight;
      args.weight_scale = l.weight_scale;
      args.weight_recipe = l.weight_recipe;
      args.bias = l.bias;
      args.out = out.view;
      progress.step("running " + layer);
      poison(out.view);
      DeviceRun run(backend);
      const LinearArgs device_args = run.upload(args);
      row.seconds = median_seconds([&] { linear(device_args, {backend}); }, run, iters);
      run.download(device_args.out, out.view);
      const double flops_per_token = 2.0 * static_cast<double>(l.n) * static_cast<double>(l.k);
      row.flops = flops_per_token * static_cast<double>(tokens);
      row.checked_tokens = reference_tokens(tokens, flops_per_token);
      progress.step("reference on " + std::to_string(row.checked_tokens) + " tokens");
      HostTensor ref(DType::F32, {row.checked_tokens, l.n});
      poison(ref.view);
      LinearArgs ref_args = first_rows(args, row.checked_tokens);
      ref_args.out = ref.view;
      linear(ref_args, {Backend::Reference});
      const Comparison cmp = compare(out.view, ref.view, row.checked_tokens);
      row.non_finite = compare(out.view, out.view).non_finite;
      row.rel = cmp.rel;
      row.ok = row.non_finite == 0 && cmp.ok(row.tolerance);
    } else {
      const ExpertsLayer l = ckpt.experts(layer);
      row.recipe = l.weight_recipe.name() + " x " + l.activation_recipe.name();
      row.tolerance = kMoeTolerance;
      MoeData data;
      data.recipe = {row.recipe, l.weight_recipe, l.activation_recipe};
      MoeProblem& p = data.problem;
      p.tokens = tokens;
      p.hidden = l.hidden;
      p.inter = l.intermediate;
      p.experts = l.num_experts;
      p.top_k = std::min<int64_t>(ckpt.moe().top_k > 0 ? ckpt.moe().top_k : 8, l.num_experts);
      p.activation = l.activation;
      p.swiglu_limit = l.swiglu_limit;
      p.swiglu_alpha = l.swiglu_alpha;
      p.interleaved = l.interleaved_gate_up;
      p.skip_slots = false;
      shape = "experts E=" + std::to_string(p.experts) + " H=" + std::to_string(p.hidden) + " I=" +
              std::to_string(p.inter) + " top-" + std::to_string(p.top_k) + " " + p.variant();
      make_moe_inputs(rng, data, /*calibrate=*/false);  // static scales come from the checkpoint
      HostTensor out(DType::BF16, {tokens, p.hidden});
      MoeArgs args;
      args.hidden = data.hidden.view;
      args.top_k_index = data.top_k_index.view;
      args.top_k_weights = data.top_k_weights.view;
      args.gate_up = l.gate_up;
      args.gate_up_scale = l.gate_up_scale;
      args.down = l.down;
      args.down_scale = l.down_scale;
      args.weight_recipe = l.weight_recipe;
      args.activation_recipe = l.activation_recipe;
      args.gate_up_act_scale = l.gate_up_act_scale;
      args.down_act_scale = l.down_act_scale;
      args.gate_up_bias = l.gate_up_bias;
      args.down_bias = l.down_bias;
      args.activation = l.activation;
      args.swiglu_limit = l.swiglu_limit;
      args.swiglu_alpha = l.swiglu_alpha;
      args.interleaved_gate_up = l.interleaved_gate_up;
      args.out = out.view;
      progress.step("running " + layer);
      poison(out.view);
      DeviceRun run(backend);
      const MoeArgs device_args = run.upload(args);
      row.seconds = median_seconds([&] { moe_experts(device_args, {backend}); }, run, iters);
      run.download(device_args.out, out.view);
      row.flops = static_cast<double>(data.active_slots) * p.flops_per_slot();
      row.checked_tokens = reference_tokens(tokens, p.flops_per_slot() * static_cast<double>(p.top_k));
      progress.step("reference on " + std::to_string(row.checked_tokens) + " tokens");
      check_moe(args, out, row);
    }
  } catch (const Error& e) {
    if (row.recipe.empty()) throw;  // the layer itself could not be loaded
    row.error = e.what();
  }
  progress.done();

  const std::vector<Row> rows{row};
  if (json) {
    nlohmann::json out = {{"mode", "checkpoint"},  {"checkpoint", path}, {"layer", layer},
                          {"shape", shape},        {"backend", backend_name(backend)},
                          {"iters", iters},        {"seed", seed},
                          {"results", rows_json(rows)}, {"ok", row.ok}};
    std::printf("%s\n", out.dump(2).c_str());
    return row.ok ? 0 : 1;
  }
  std::printf("finegemm run: %s from %s\n%s, %lld random tokens, on %s%s; median of %lld runs\n\n", layer.c_str(),
              path.c_str(), shape.c_str(), static_cast<long long>(tokens), backend_name(backend),
              threads_note(backend).c_str(), static_cast<long long>(iters));
  print_rows(rows, false);
  std::printf("\n%s: within %.0e of the CPU reference on the first %lld tokens\n", row.ok ? "ok" : "FAIL",
              row.tolerance, static_cast<long long>(row.checked_tokens));
  return row.ok ? 0 : 1;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  ArgParser parser("run",
                   "Without --checkpoint: builds a small DeepSeek-V3-shaped MoE block (SwiGLU, top-8 of 32 experts)\n"
                   "in every recipe, runs it on random tokens, and prints time, throughput and the relative error\n"
                   "against the CPU reference. With --checkpoint: the same for one layer of a Hugging Face FP8/FP4\n"
                   "checkpoint (a linear layer, or an experts block with random routing).");
  parser.option("checkpoint", "DIR", "a model directory (config.json + *.safetensors) or one .safetensors file");
  parser.option("layer", "NAME",
                "layer to run, e.g. model.layers.0.mlp.down_proj or model.layers.1.mlp.experts "
                "(default: the first quantized layer)");
  parser.option("tokens", "T", "number of tokens (default: 128 on cpu, 4096 on cuda; 64 for a checkpoint on cpu)");
  parser.option("backend", "auto|cpu|cuda|ref", "where to run (auto: cuda when a device is present, else cpu)", "auto");
  parser.option("iters", "N", "timed runs (the median is reported)", "3");
  parser.option("seed", "N", "random seed (default: a fresh one)");
  parser.flag("json", "print the results as JSON on stdout");
  if (!parser.parse(argc, argv)) return 0;

  Backend backend = parse_backend(parser.get_choice("backend", {"auto", "cpu", "cuda", "ref", "reference"}));
  if (backend == Backend::Auto) backend = cuda_available() ? Backend::Cuda : Backend::Cpu;
  if (backend == Backend::Cuda && !cuda_available())
    throw Error(std::string("--backend: cuda requested, but ") +
                (FINEGEMM_WITH_CUDA ? "no CUDA device was found" : "this finegemm was built without CUDA"));
  const bool has_checkpoint = parser.has("checkpoint");
  if (parser.has("layer") && !has_checkpoint) throw Error("--layer: needs --checkpoint DIR, got no checkpoint");
  const int64_t default_tokens = backend == Backend::Cuda ? 4096 : has_checkpoint ? 64 : 128;
  const int64_t tokens = parser.has("tokens") ? parser.get_int("tokens", 1, int64_t{1} << 24) : default_tokens;
  const int64_t iters = parser.get_int("iters", 1, 1000);
  const uint64_t seed = seed_from(parser.get("seed"));
  const bool json = parser.has("json");
  if (has_checkpoint) return run_checkpoint(parser.get("checkpoint"), parser.get("layer"), backend, tokens, iters, seed, json);
  return run_synthetic(backend, tokens, iters, seed, json);
}

}  // namespace finegemm::tools
