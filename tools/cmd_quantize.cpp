// finegemm quantize IN OUT --weights block128|channel|tensor|mxfp4 --activations dynamic|static [--calib FILE]
//                   [--scale-fmt float|ue8m0] [--json]
//
// Turns a bf16/f16/f32 safetensors model into a quantized checkpoint that transformers' FineGrainedFP8Config loads
// (and finegemm's Checkpoint reads back). Written keys (see include/finegemm/checkpoint.hpp for where they come from):
//   linear  <name>.weight (F8_E4M3 [N, K], or I8 [N, K/2] packed FP4 for mxfp4), <name>.weight_scale_inv,
//           static: <name>.activation_scale (F32 scalar, FP8Linear's parameter)
//   experts <name>.gate_up_proj / up_proj / down_proj [E, N, K] and <proj>_scale_inv [E, ...],
//           static: <name>.gate_up_proj_activation_scale [E], <name>.down_proj_activation_scale [E] (FP8Experts)
// Every other tensor is copied unchanged, and so are the directory's other files (tokenizer, generation config).
//
// What transformers can load: block128 (FP32 or UE8M0 scales) and tensor (weight_block_size null, scalar scale),
// dynamic or static. `channel` ([N] scales) and `mxfp4` linears are finegemm's own reading of the same keys:
// FP8Linear has no per-channel or FP4 form.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"
#include "finegemm/checkpoint.hpp"
#include "finegemm/finegemm.hpp"
#include "finegemm/safetensors.hpp"
#include "io/io_util.hpp"

namespace finegemm::tools {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string strip(const std::string& s, const std::string& suffix) {
  return ends_with(s, suffix) ? s.substr(0, s.size() - suffix.size()) : s;
}
bool is_float(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

struct Settings {
  std::string weights, activations, scale_fmt;
  WeightRecipe weight_recipe;
  ActivationRecipe activation_recipe;
  QuantizationConfig config;  // what config.json will say, as finegemm reads it back
  json quantization_config;   // the same, as written
};

Settings make_settings(const std::string& weights, const std::string& activations, const std::string& scale_fmt_arg) {
  Settings s;
  s.weights = weights;
  s.activations = activations;
  s.scale_fmt = scale_fmt_arg.empty() ? (weights == "mxfp4" ? "ue8m0" : "float") : scale_fmt_arg;
  const ScaleFormat fmt = s.scale_fmt == "ue8m0" ? ScaleFormat::UE8M0 : ScaleFormat::FP32;
  json qc = {{"quant_method", "fp8"}, {"activation_scheme", activations}, {"fmt", "e4m3"}, {"scale_fmt", s.scale_fmt}};
  if (weights == "block128") {
    s.weight_recipe = WeightRecipe::block(128, 128, fmt);
    qc["weight_block_size"] = {128, 128};
  } else if (weights == "mxfp4") {
    s.weight_recipe = WeightRecipe::mxfp4(fmt);
    qc["weight_block_size"] = {1, 32};
    qc["fmt"] = "e2m1";
  } else {
    if (fmt != ScaleFormat::FP32)
      throw Error("--scale-fmt: expected float for --weights " + weights + " (per-" +
                  (weights == "channel" ? std::string("channel") : std::string("tensor")) +
                  " scales are float32), got ue8m0");
    s.weight_recipe = weights == "channel" ? WeightRecipe::per_channel() : WeightRecipe::per_tensor();
    qc["weight_block_size"] = nullptr;
  }
  s.quantization_config = qc;
  s.config = parse_quantization_config(json{{"quantization_config", qc}}.dump());
  s.activation_recipe = resolve_activation_recipe(s.config, s.weight_recipe);
  return s;
}

// Linear weights that stay in high precision: embeddings, norms, the output head and MoE routers (their logits pick
// the experts; every FP8 checkpoint keeps them in bf16).
bool keep_unquantized(const std::string& base) {
  const std::string leaf = base.substr(base.rfind('.') == std::string::npos ? 0 : base.rfind('.') + 1);
  return base.find("embed") != std::string::npos || base.find("norm") != std::string::npos ||
         base.find("lm_head") != std::string::npos || leaf == "gate" || leaf == "router" || leaf == "wte" ||
         leaf == "wpe" || leaf == "shared_expert_gate";
}

// What happens to one input tensor.
struct Plan {
  enum Kind { Copy, Linear, Experts } kind = Copy;
  std::string name;  // input tensor
  std::string base;  // linear: <name> without .weight; experts: <name> without the projection
  std::string proj;  // experts: "gate_up_proj", "up_proj" or "down_proj"
  std::string why_kept;  // a linear-looking weight left in high precision, and why
};

Plan plan_for(const std::string& name, const SafetensorsEntry& e, const Settings& s) {
  Plan p;
  p.name = name;
  if (!is_float(e.dtype)) return p;
  if (ends_with(name, ".weight") && e.shape.size() == 2) {
    p.base = strip(name, ".weight");
    if (keep_unquantized(p.base)) return p;
    const int64_t k = e.shape[1];
    const int64_t multiple = s.weight_recipe.granularity == WeightGranularity::Block ? s.weight_recipe.block_k
                             : s.weight_recipe.granularity == WeightGranularity::MX  ? 32
                             : s.activation_recipe.granularity == ActGranularity::PerTokenGroup
                                 ? s.activation_recipe.group_size
                                 : 1;
    if (k % multiple != 0 || e.shape[0] == 0 || k == 0) {
      p.why_kept = "K=" + std::to_string(k) + " is not a multiple of " + std::to_string(multiple);
      return p;
    }
    p.kind = Plan::Linear;
    return p;
  }
  for (const char* proj : {"gate_up_proj", "up_proj", "down_proj"}) {
    if (!ends_with(name, std::string(".") + proj) || e.shape.size() != 3) continue;
    p.base = strip(name, std::string(".") + proj);
    p.proj = proj;
    const int64_t k = e.shape[2];
    const int64_t multiple = s.weight_recipe.granularity == WeightGranularity::Block ? s.weight_recipe.block_k
                             : s.weight_recipe.granularity == WeightGranularity::MX  ? 32
                                                                                     : 1;
    if (k % multiple != 0) {
      p.why_kept = "K=" + std::to_string(k) + " is not a multiple of " + std::to_string(multiple);
      return p;
    }
    p.kind = Plan::Experts;
    return p;
  }
  return p;
}

// ---- Calibration: activation samples → static scales (amax / 448).
float static_scale(double amax) { return static_cast<float>(std::max(amax, 1e-4) / 448.0); }

double amax_of(const TensorView& t, int64_t begin, int64_t end, const std::string& key) {
  double m = 0;
  for (int64_t i = begin; i < end; ++i) {
    const float v = read_float(t, i);
    if (!std::isfinite(v)) throw Error("--calib: " + key + ": expected finite activations, found " + std::to_string(v));
    m = std::max(m, static_cast<double>(std::fabs(v)));
  }
  return m;
}

class Calibration {
 public:
  explicit Calibration(const std::string& path) : file_(SafetensorsFile::open(path)) {}

  // One scale for the input of linear `base` ([*, K] samples under `base` or `base.input`).
  float linear(const std::string& base, int64_t k) const {
    const auto [key, t] = lookup({base + ".input", base}, base);
    if (t.ndim < 1 || t.size(-1) != k || t.numel() == 0)
      throw Error("--calib: " + key + ": expected activation samples of shape [*, " + std::to_string(k) + "] for " + base +
                  ", got " + shape_string(t));
    return static_scale(amax_of(t, 0, t.numel(), key));
  }

  // One scale per expert for the input of `base.proj`: [E, S, K] samples (per expert) or [S, K] (shared).
  std::vector<float> experts(const std::string& base, const std::string& proj, int64_t num_experts, int64_t k) const {
    const std::string name = base + "." + proj;
    const auto [key, t] = lookup({name + ".input", name}, name);
    std::vector<float> scales(num_experts);
    if (t.ndim == 3 && t.shape[0] == num_experts && t.shape[2] == k) {
      const int64_t per = t.shape[1] * k;
      for (int64_t e = 0; e < num_experts; ++e) scales[e] = static_scale(amax_of(t, e * per, (e + 1) * per, key));
    } else if (t.ndim == 2 && t.shape[1] == k) {
      std::fill(scales.begin(), scales.end(), static_scale(amax_of(t, 0, t.numel(), key)));
    } else {
      throw Error("--calib: " + key + ": expected activation samples of shape [" + std::to_string(num_experts) + ", S, " +
                  std::to_string(k) + "] (per expert) or [S, " + std::to_string(k) + "] (shared), got " + shape_string(t));
    }
    return scales;
  }

 private:
  std::pair<std::string, TensorView> lookup(std::initializer_list<std::string> keys, const std::string& what) const {
    for (const auto& key : keys)
      if (file_.contains(key)) {
        TensorView t = file_.get(key);
        if (!is_float(t.dtype))
          throw Error(ErrorKind::Type, "--calib: " + key + ": expected float32/bfloat16/float16 activations, got " +
                                           std::string(dtype_name(t.dtype)));
        return {key, t};
      }
    throw Error("--activations static: " + file_.path() + " has no calibration activations for " + what + " (expected " +
                what + ".input or " + what + ")");
  }
  SafetensorsFile file_;
};

// ---- Quantizing one [N, K] matrix (or a stack of E), with the error of the round trip.
struct Quantized {
  HostTensor weight, scale;
  double rel_error = 0;  // ‖dequant(q) − w‖ / ‖w‖ over the whole tensor
};

TensorView slice(const TensorView& t, int64_t index, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return TensorView::of(static_cast<uint8_t*>(t.data) + index * n * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype,
                        shape);
}

Quantized quantize_stack(const TensorView& w, const WeightRecipe& recipe) {
  const bool stacked = w.ndim == 3;
  const int64_t count = stacked ? w.shape[0] : 1, n = w.size(-2), k = w.size(-1);
  const DType storage = recipe.element == ElementType::FP4_E2M1 ? DType::I8 : DType::F8_E4M3;
  const std::vector<int64_t> wq_shape = {n, weight_storage_cols(recipe, k)};
  const std::vector<int64_t> scale_shape = weight_scale_shape(recipe, n, k);
  auto stack_shape = [&](std::vector<int64_t> s) {
    if (stacked) s.insert(s.begin(), count);
    return s;
  };
  Quantized q;
  q.weight = HostTensor(storage, stack_shape(wq_shape));
  q.scale = HostTensor(weight_scale_dtype(recipe), stack_shape(scale_shape));
  HostTensor back(DType::F32, {n, k});
  double num = 0, den = 0;
  for (int64_t e = 0; e < count; ++e) {
    const TensorView src = slice(w, e, {n, k});
    const TensorView wq = slice(q.weight.view, e, wq_shape), ws = slice(q.scale.view, e, scale_shape);
    quantize_weights(src, recipe, wq, ws);
    dequantize_weights(wq, ws, recipe, back.view);
    const float* b = back.ptr<float>();
    for (int64_t i = 0; i < n * k; ++i) {
      const double o = read_float(src, i), d = b[i] - o;
      num += d * d;
      den += o * o;
    }
  }
  q.rel_error = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  return q;
}

struct LayerReport {
  std::string name, kind;
  std::vector<int64_t> shape;
  double rel_error = 0;
  std::vector<float> act_scales;  // static
};

const char* const kUsageNotes =
    "\nWeights: block128 = FP8 with 128x128 block scales (DeepSeek-V3 layout), channel = FP8 with one scale per\n"
    "output row, tensor = FP8 with one scale, mxfp4 = FP4 E2M1 with 1x32 UE8M0 scales (DeepSeek-V4 layout).\n"
    "Static activations need --calib FILE: a safetensors file mapping each layer name (or <name>.input) to\n"
    "activation samples [*, K]; experts take <name>.gate_up_proj(.input) / <name>.down_proj(.input) as [E, S, K]\n"
    "or [S, K]. The scale written is amax / 448.\n";

}  // namespace

int cmd_quantize(int argc, char** argv) {
  ArgParser args("quantize", "Quantize a bf16/f16/f32 safetensors model into an FP8/FP4 checkpoint.");
  args.positional("IN", "model directory (config.json + *.safetensors) or one .safetensors file");
  args.positional("OUT", "output directory (created if needed)");
  args.option("weights", "RECIPE", "block128 | channel | tensor | mxfp4", "block128");
  args.option("activations", "SCHEME", "dynamic | static", "dynamic");
  args.option("calib", "FILE", "calibration activations (safetensors), needed for --activations static");
  args.option("scale-fmt", "FMT", "float | ue8m0 (default: float; ue8m0 for mxfp4)");
  args.flag("json", "print a machine-readable summary on stdout");
  if (!args.parse(argc, argv)) {
    std::fputs(kUsageNotes, stdout);
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string in = args.positionals()[0], out = args.positionals()[1];
  const std::string weights = args.get_choice("weights", {"block128", "channel", "tensor", "mxfp4"});
  const std::string activations = args.get_choice("activations", {"dynamic", "static"});
  const std::string scale_fmt = args.has("scale-fmt") ? args.get_choice("scale-fmt", {"float", "ue8m0"}) : "";
  const bool as_json = args.has("json");
  const Settings settings = make_settings(weights, activations, scale_fmt);
  const bool is_static = activations == "static";
  if (is_static && !args.has("calib"))
    throw Error("--activations static: expected --calib FILE with calibration activations, got none");
  if (!is_static && args.has("calib"))
    throw Error("--calib: only used with --activations static, got --activations dynamic");
  std::optional<Calibration> calib;
  if (is_static) calib.emplace(args.get("calib"));

  const ModelFiles model = ModelFiles::open(in);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) throw Error("OUT: expected a directory, got the file " + out);
  fs::create_directories(out, ec);
  if (ec) throw Error(ErrorKind::Runtime, "OUT: cannot create " + out + ": " + ec.message());
  if (fs::equivalent(fs::path(model.directory()), fs::path(out), ec))
    throw Error("OUT: expected a directory other than IN (" + in + "), the input would be overwritten");

  // Plan every tensor first: the count drives the progress bar, and errors surface before any work.
  std::vector<std::vector<Plan>> plans(model.files().size());
  int64_t to_quantize = 0;
  std::vector<std::string> kept;  // linear-looking weights left in high precision (modules_to_not_convert)
  for (size_t f = 0; f < model.files().size(); ++f)
    for (const auto& e : model.files()[f].entries()) {
      Plan p = plan_for(e.name, e, settings);
      if (p.kind != Plan::Copy) ++to_quantize;
      if (p.kind == Plan::Copy && !p.base.empty() && ends_with(e.name, ".weight") && e.shape.size() == 2 &&
          is_float(e.dtype) && p.base.find("embed") == std::string::npos && p.base.find("norm") == std::string::npos)
        kept.push_back(p.base);
      plans[f].push_back(std::move(p));
    }
  if (to_quantize == 0)
    throw Error("IN: " + in + " has no bf16/f16/f32 linear weights to quantize (2-D <name>.weight, or 3-D expert "
                "gate_up_proj/down_proj)");

  Progress progress("quantize", to_quantize);
  std::vector<LayerReport> reports;
  std::map<std::string, std::string> weight_map;  // output tensor → output file
  int64_t copied = 0, bytes_out = 0;
  const bool sharded = model.files().size() > 1;
  for (size_t f = 0; f < model.files().size(); ++f) {
    const SafetensorsFile& file = model.files()[f];
    const std::string out_name = sharded ? fs::path(file.path()).filename().string() : "model.safetensors";
    std::vector<NamedTensor> tensors;
    std::vector<Quantized> held;  // quantized outputs of this file, alive until it is written
    std::vector<HostTensor> scalars;
    held.reserve(plans[f].size());
    scalars.reserve(2 * plans[f].size());
    for (const Plan& p : plans[f]) {
      const TensorView src = file.get(p.name);
      if (p.kind == Plan::Copy) {
        tensors.push_back({p.name, src});
        ++copied;
        continue;
      }
      progress.step(p.name);
      LayerReport report;
      report.name = p.kind == Plan::Linear ? p.base : p.name;
      report.kind = p.kind == Plan::Linear ? "linear" : "experts";
      report.shape = src.sizes();
      held.push_back(quantize_stack(src, settings.weight_recipe));
      const Quantized& q = held.back();
      report.rel_error = q.rel_error;
      const std::string weight_key = p.kind == Plan::Linear ? p.base + ".weight" : p.name;
      const std::string scale_key = p.kind == Plan::Linear ? p.base + ".weight_scale_inv" : p.name + "_scale_inv";
      tensors.push_back({weight_key, q.weight.view});
      tensors.push_back({scale_key, q.scale.view});
      if (is_static) {
        if (p.kind == Plan::Linear) {
          report.act_scales = {calib->linear(p.base, src.size(-1))};
          scalars.emplace_back(DType::F32, std::vector<int64_t>{});
          scalars.back().ptr<float>()[0] = report.act_scales[0];
          tensors.push_back({p.base + ".activation_scale", scalars.back().view});
        } else {
          // FP8Experts holds one input scale per expert and per projection; the no-gate up_proj uses the gate_up name.
          report.act_scales = calib->experts(p.base, p.proj, src.shape[0], src.shape[2]);
          const std::string key = p.base + (p.proj == "down_proj" ? ".down_proj" : ".gate_up_proj") + "_activation_scale";
          scalars.emplace_back(DType::F32, std::vector<int64_t>{src.shape[0]});
          std::copy(report.act_scales.begin(), report.act_scales.end(), scalars.back().ptr<float>());
          tensors.push_back({key, scalars.back().view});
        }
      }
      reports.push_back(std::move(report));
    }
    std::map<std::string, std::string> metadata = file.metadata();
    metadata["format"] = metadata.count("format") ? metadata["format"] : "pt";
    metadata["quantized_by"] = "finegemm quantize --weights " + weights + " --activations " + activations;
    save_safetensors((fs::path(out) / out_name).string(), tensors, metadata);
    for (const auto& t : tensors) {
      weight_map[t.name] = out_name;
      bytes_out += t.tensor.numel() * static_cast<int64_t>(dtype_size(t.tensor.dtype));
    }
  }
  progress.done();

  // config.json: the input's, with quantization_config. Weights left in high precision are named exactly ("$"),
  // since transformers matches these entries as regex prefixes ("mlp.gate" would also catch "mlp.gate_proj").
  json config = json::parse(model.config_json());
  json qc = settings.quantization_config;
  json skip = json::array({"lm_head"});
  for (const auto& base : kept)
    if (base != "lm_head") skip.push_back(base + "$");
  qc["modules_to_not_convert"] = skip;
  config["quantization_config"] = qc;
  io::write_text_file((fs::path(out) / "config.json").string(), config.dump(2) + "\n");
  if (sharded) {
    json index = {{"metadata", {{"total_size", bytes_out}}}, {"weight_map", weight_map}};
    io::write_text_file((fs::path(out) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  // The directory's other files (tokenizer, generation config, ...).
  if (fs::is_directory(in))
    for (const auto& de : fs::directory_iterator(in, ec)) {
      const std::string name = de.path().filename().string();
      if (!de.is_regular_file() || name.empty() || name[0] == '.' || ends_with(name, ".safetensors") ||
          name == "config.json" || name == "model.safetensors.index.json")
        continue;
      fs::copy_file(de.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) throw Error(ErrorKind::Runtime, "cannot copy " + de.path().string() + " to " + out + ": " + ec.message());
    }

  const double seconds = seconds_since(start);
  double worst = 0;
  for (const auto& r : reports) worst = std::max(worst, r.rel_error);
  if (as_json) {
    json layers = json::array();
    for (const auto& r : reports) {
      json l = {{"name", r.name}, {"kind", r.kind}, {"shape", r.shape}, {"rel_error", r.rel_error}};
      if (is_static) l["activation_scale"] = r.act_scales.size() == 1 ? json(r.act_scales[0]) : json(r.act_scales);
      layers.push_back(l);
    }
    json summary = {{"input", in},
                    {"output", out},
                    {"weights", weights},
                    {"activations", activations},
                    {"scale_fmt", settings.scale_fmt},
                    {"weight_recipe", settings.weight_recipe.name()},
                    {"activation_recipe", settings.activation_recipe.name()},
                    {"quantization_config", qc},
                    {"quantized", static_cast<int64_t>(reports.size())},
                    {"copied", copied},
                    {"kept_high_precision", kept},
                    {"files", static_cast<int64_t>(model.files().size())},
                    {"bytes_out", bytes_out},
                    {"max_rel_error", worst},
                    {"seconds", seconds},
                    {"layers", layers}};
    std::printf("%s\n", summary.dump(2).c_str());
  } else {
    std::printf("quantized %zu tensors to %s x %s (max weight error %s), copied %lld unchanged\n", reports.size(),
                settings.weight_recipe.name().c_str(), settings.activation_recipe.name().c_str(),
                format_sci(worst).c_str(), static_cast<long long>(copied));
    if (!kept.empty()) std::printf("kept in high precision: %zu linear weights (routers, lm_head, K not divisible)\n", kept.size());
    std::printf("wrote %s (%.1f MB) in %.2f s\n", out.c_str(), bytes_out / 1e6, seconds);
  }
  return 0;
}

}  // namespace finegemm::tools
