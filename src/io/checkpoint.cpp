// Hugging Face config.json parsing and layer discovery. See include/finegemm/checkpoint.hpp for the key names.
#include "finegemm/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "core/formats.hpp"
#include "finegemm/error.hpp"

namespace finegemm {
namespace {

using json = nlohmann::json;

json parse_config(const std::string& config_json) {
  try {
    json root = json::parse(config_json);
    if (!root.is_object()) throw Error(std::string("config.json: expected a JSON object, got ") + root.type_name());
    return root;
  } catch (const json::exception& e) {
    throw Error(std::string("config.json: not valid JSON: ") + e.what());
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string strip(const std::string& s, const std::string& suffix) {
  return ends_with(s, suffix) ? s.substr(0, s.size() - suffix.size()) : s;
}

// First integer field among `keys`, in `obj` (0 when none).
int64_t first_int(const json& obj, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    if (!it->is_number_integer())
      throw Error(std::string("config.json: ") + key + ": expected an integer, got " + it->dump());
    return it->get<int64_t>();
  }
  return 0;
}
float first_float(const json& obj, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    if (!it->is_number()) throw Error(std::string("config.json: ") + key + ": expected a number, got " + it->dump());
    return it->get<float>();
  }
  return 0.0f;
}

// Drops a leading expert dimension: the per-matrix shape of one expert.
std::vector<int64_t> per_matrix(const TensorView& t, bool stacked) {
  std::vector<int64_t> s = t.sizes();
  if (stacked && !s.empty()) s.erase(s.begin());
  return s;
}

TensorView reshaped(TensorView t, const std::vector<int64_t>& shape) {
  TensorView r = TensorView::of(t.data, t.dtype, shape, t.device);
  return r;
}

bool is_fp4_storage(DType d) { return d == DType::U8 || d == DType::I8; }

}  // namespace

QuantizationConfig parse_quantization_config(const std::string& config_json) {
  const json root = parse_config(config_json);
  QuantizationConfig q;
  const auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return q;
  if (!it->is_object()) throw Error(std::string("quantization_config: expected an object, got ") + it->type_name());
  const json& qc = *it;
  q.present = true;
  auto get_string = [&](const char* key, const std::string& fallback) -> std::string {
    const auto f = qc.find(key);
    if (f == qc.end() || f->is_null()) return fallback;
    if (!f->is_string()) throw Error(std::string("quantization_config.") + key + ": expected a string, got " + f->dump());
    return f->get<std::string>();
  };
  q.quant_method = get_string("quant_method", "");

  const std::string scheme = get_string("activation_scheme", "dynamic");
  if (scheme != "dynamic" && scheme != "static")
    throw Error("quantization_config.activation_scheme: expected \"dynamic\" or \"static\", got \"" + scheme + "\"");
  q.static_activations = scheme == "static";
  q.activation_scheme_given = qc.contains("activation_scheme") && !qc["activation_scheme"].is_null();

  const std::string scale_fmt = get_string("scale_fmt", "float");
  if (scale_fmt != "float" && scale_fmt != "ue8m0")
    throw Error("quantization_config.scale_fmt: expected \"float\" or \"ue8m0\", got \"" + scale_fmt + "\"");
  q.ue8m0_scales = scale_fmt == "ue8m0";

  q.fmt = get_string("fmt", q.quant_method == "mxfp4" ? "e2m1" : "e4m3");
  if (q.fmt != "e4m3" && q.fmt != "e2m1")
    throw Error("quantization_config.fmt: expected \"e4m3\" (FP8) or \"e2m1\" (FP4), got \"" + q.fmt + "\"");

  if (q.quant_method == "mxfp4") {  // GPT-OSS: 1×32 groups along K, whatever else the config says
    q.has_block_size = true;
    q.block_n = 1;
    q.block_k = 32;
  }
  const auto bs = qc.find("weight_block_size");
  if (bs != qc.end()) {
    if (bs->is_null()) {
      q.has_block_size = false;
      q.block_n = q.block_k = 0;
    } else {
      const bool ok = bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer() &&
                      (*bs)[1].is_number_integer() && (*bs)[0].get<int64_t>() > 0 && (*bs)[1].get<int64_t>() > 0 &&
                      (*bs)[0].get<int64_t>() <= (1 << 20) && (*bs)[1].get<int64_t>() <= (1 << 20);
      if (!ok)
        throw Error("quantization_config.weight_block_size: expected [block_n, block_k] with positive integers, or "
                    "null, got " + bs->dump());
      q.has_block_size = true;
      q.block_n = static_cast<int>((*bs)[0].get<int64_t>());
      q.block_k = static_cast<int>((*bs)[1].get<int64_t>());
    }
  }
  const auto skip = qc.find("modules_to_not_convert");
  if (skip != qc.end() && skip->is_array())
    for (const auto& m : *skip)
      if (m.is_string()) q.modules_to_not_convert.push_back(m.get<std::string>());
  return q;
}

MoeConfig parse_moe_config(const std::string& config_json) {
  const json root = parse_config(config_json);
  const json* obj = &root;
  // Multimodal models keep the language model's fields in text_config.
  if (!root.contains("hidden_size") && root.contains("text_config") && root["text_config"].is_object())
    obj = &root["text_config"];
  MoeConfig m;
  if (root.contains("model_type") && root["model_type"].is_string()) m.model_type = root["model_type"].get<std::string>();
  for (const char* key : {"hidden_act", "hidden_activation"})
    if (obj->contains(key) && (*obj)[key].is_string()) {
      m.hidden_act = (*obj)[key].get<std::string>();
      break;
    }
  m.hidden_size = first_int(*obj, {"hidden_size"});
  m.intermediate_size = first_int(*obj, {"moe_intermediate_size", "intermediate_size"});
  m.num_experts = first_int(*obj, {"n_routed_experts", "num_experts", "num_local_experts"});
  m.top_k = first_int(*obj, {"num_experts_per_tok", "experts_per_token"});
  m.swiglu_limit = first_float(*obj, {"swiglu_limit"});
  m.swiglu_alpha = first_float(*obj, {"swiglu_alpha"});
  // NOTE: GPT-OSS's config carries swiglu_limit (7.0) but not alpha: transformers hard-codes 1.702 in the model.
  if (m.swiglu_alpha == 0.0f && m.model_type == "gpt_oss") m.swiglu_alpha = 1.702f;
  if (obj->contains("expert_dtype") && (*obj)["expert_dtype"].is_string())
    m.fp4_experts = (*obj)["expert_dtype"].get<std::string>() == "fp4";
  for (auto [v, key] : {std::pair{m.hidden_size, "hidden_size"}, {m.intermediate_size, "intermediate_size"},
                        {m.num_experts, "num_experts"}, {m.top_k, "num_experts_per_tok"}})
    if (v < 0) throw Error(std::string("config.json: ") + key + ": expected a non-negative integer, got " + std::to_string(v));
  if (!(m.swiglu_limit >= 0.0f) || !std::isfinite(m.swiglu_limit))
    throw Error("config.json: swiglu_limit: expected a finite non-negative number, got " + std::to_string(m.swiglu_limit));
  return m;
}

WeightRecipe resolve_weight_recipe(const QuantizationConfig& config, const TensorView& weight, const TensorView& scale,
                                   const std::string& name) {
  if (!weight.defined() || !scale.defined())
    throw Error(name + ": expected a weight and its scale tensor, got " + (weight.defined() ? "no scale" : "no weight"));
  const bool stacked = weight.ndim == 3;
  if (weight.ndim != 2 && weight.ndim != 3)
    throw Error(name + ": expected a weight of shape [N, K] or [E, N, K], got " + shape_string(weight));
  const std::vector<int64_t> w = per_matrix(weight, stacked);
  std::vector<int64_t> s = per_matrix(scale, stacked);
  if (stacked && (scale.ndim < 1 || scale.shape[0] != weight.shape[0]))
    throw Error(name + ": scale: expected a leading expert dimension of " + std::to_string(weight.shape[0]) + ", got " +
                shape_string(scale));
  const int64_t n = w[0];
  const bool fp4 = is_fp4_storage(weight.dtype);
  const int64_t k = fp4 ? 2 * w[1] : w[1];

  auto scale_format = [&](bool allow_u8) {
    switch (scale.dtype) {
      case DType::F32: return ScaleFormat::FP32;
      case DType::F8_E8M0: return ScaleFormat::UE8M0;
      case DType::I32: return ScaleFormat::UE8M0_PACKED;
      case DType::U8:
        if (allow_u8) return ScaleFormat::UE8M0;  // GPT-OSS stores the UE8M0 exponents as uint8
        [[fallthrough]];
      default:
        throw Error(ErrorKind::Type, name + ": scale: expected dtype float32, float8_e8m0fnu or int32 (packed UE8M0), got " +
                                         std::string(dtype_name(scale.dtype)));
    }
  };

  if (fp4) {
    WeightRecipe r = WeightRecipe::mxfp4(scale_format(true));
    const std::vector<int64_t> expect = weight_scale_shape(r, n, k);
    if (s != expect)
      throw Error(name + ": scale: expected shape " + shape_string(expect) + " for packed FP4 weight " +
                  shape_string(weight) + " (N=" + std::to_string(n) + ", K=" + std::to_string(k) +
                  ", 1x32 groups), got " + shape_string(scale));
    return r;
  }
  if (weight.dtype != DType::F8_E4M3)
    throw Error(ErrorKind::Type, name + ": weight: expected dtype float8_e4m3fn, or uint8/int8 packed FP4, got " +
                                     std::string(dtype_name(weight.dtype)));
  const ScaleFormat fmt = scale_format(false);
  // Block scales. The config's weight_block_size if given, else the 128×128 every shipped checkpoint uses.
  const int bn = config.has_block_size ? config.block_n : 128;
  const int bk = config.has_block_size ? config.block_k : 128;
  const WeightRecipe block = WeightRecipe::block(bn, bk, fmt);
  if (config.has_block_size && s == weight_scale_shape(block, n, k)) return block;
  int64_t scale_numel = 1;
  for (auto d : s) scale_numel *= d;
  if (scale_numel == 1 || (s.size() == 1 && s[0] == n) || (s.size() == 2 && s[0] == n && s[1] == 1)) {
    if (fmt != ScaleFormat::FP32)
      throw Error(ErrorKind::Type, name + ": scale: a per-tensor or per-channel scale must be float32, got " +
                                       std::string(dtype_name(scale.dtype)));
    return scale_numel == 1 ? WeightRecipe::per_tensor() : WeightRecipe::per_channel();
  }
  const std::vector<int64_t> expect = weight_scale_shape(block, n, k);
  if (s != expect)
    throw Error(name + ": scale: expected shape " + shape_string(expect) + " for N=" + std::to_string(n) + ", K=" +
                std::to_string(k) + " with " + std::to_string(bn) + "x" + std::to_string(bk) + " blocks" +
                (stacked ? " (per expert)" : "") + ", got " + shape_string(scale));
  return block;
}

ActivationRecipe resolve_activation_recipe(const QuantizationConfig& config, const WeightRecipe& weight_recipe) {
  if (config.static_activations) return ActivationRecipe::static_per_tensor();
  switch (weight_recipe.granularity) {
    case WeightGranularity::Block: return ActivationRecipe::per_token_group(weight_recipe.block_k, config.ue8m0_scales);
    case WeightGranularity::MX:
      // GPT-OSS (quant_method mxfp4): 1×32 groups like its weights. DeepSeek-V4's FP8×FP4 experts: FP8 activations in
      // 1×128 groups with UE8M0 scales, as DeepGEMM's fp8_fp4 kernels take them.
      if (config.quant_method == "mxfp4") return ActivationRecipe::per_token_group(32);
      return ActivationRecipe::per_token_group(128, config.ue8m0_scales ||
                                                        weight_recipe.scale_format != ScaleFormat::FP32);
    case WeightGranularity::PerChannel:
    case WeightGranularity::PerTensor: return ActivationRecipe::per_token(config.ue8m0_scales);
  }
  return ActivationRecipe::per_token_group(128);
}

// ---- Checkpoint ------------------------------------------------------------------------------------------------

Checkpoint Checkpoint::open(const std::string& path) { return from_files(ModelFiles::open(path)); }

Checkpoint Checkpoint::from_files(ModelFiles files) {
  Checkpoint c;
  c.quantization_ = parse_quantization_config(files.config_json());
  c.moe_ = parse_moe_config(files.config_json());
  c.files_ = std::move(files);
  return c;
}

namespace {

const char* const kWeightScaleSuffixes[] = {".weight_scale_inv", ".weight_scale"};
const char* const kActScaleSuffixes[] = {".activation_scale", ".input_scale"};

bool quantized_storage(DType d) { return d == DType::F8_E4M3 || d == DType::U8 || d == DType::I8; }

// A scalar activation scale as an F32 [] view (converting BF16/F16 scalars into `owned`).
TensorView scalar_scale(const TensorView& t, const std::string& key, std::shared_ptr<void>& owned) {
  if (t.numel() != 1) throw Error(key + ": expected a scalar activation scale, got shape " + shape_string(t));
  if (t.dtype == DType::F32) return TensorView::of(t.data, DType::F32, std::vector<int64_t>{});
  float v = 0;
  switch (t.dtype) {
    case DType::BF16: v = fmt::bf16_to_float(*static_cast<const uint16_t*>(t.data)); break;
    case DType::F16: v = fmt::f16_to_float(*static_cast<const uint16_t*>(t.data)); break;
    default: throw Error(ErrorKind::Type, key + ": expected a float32 scale, got " + std::string(dtype_name(t.dtype)));
  }
  auto value = std::make_shared<float>(v);
  owned = value;
  return TensorView::of(value.get(), DType::F32, std::vector<int64_t>{});
}

void check_act_scale(const TensorView& t, const std::string& key) {
  if (!t.defined()) return;
  const float v = *static_cast<const float*>(t.data);
  if (!(v > 0.0f) || !std::isfinite(v))
    throw Error(key + ": expected a finite positive activation scale, got " + std::to_string(v));
}

}  // namespace

std::vector<std::string> Checkpoint::linear_layers() const {
  std::vector<std::string> out;
  for (const auto& name : files_.names()) {
    if (!ends_with(name, ".weight")) continue;
    const std::string base = strip(name, ".weight");
    const SafetensorsEntry* e = files_.find(name);
    if (!e || e->shape.size() != 2 || !quantized_storage(e->dtype)) continue;
    for (const char* suffix : kWeightScaleSuffixes)
      if (files_.contains(base + suffix)) {
        out.push_back(base);
        break;
      }
  }
  return out;
}

std::vector<std::string> Checkpoint::experts_layers() const {
  std::set<std::string> out;
  for (const auto& name : files_.names()) {
    for (const char* suffix : {".gate_up_proj", ".up_proj", ".gate_up_proj_blocks"}) {
      if (!ends_with(name, suffix)) continue;
      const std::string base = strip(name, suffix);
      const SafetensorsEntry* e = files_.find(name);
      if (e && e->shape.size() >= 3 && (files_.contains(base + ".down_proj") || files_.contains(base + ".down_proj_blocks")))
        out.insert(base);
    }
  }
  return {out.begin(), out.end()};
}

LinearLayer Checkpoint::linear(const std::string& requested) const {
  LinearLayer layer;
  layer.name = strip(requested, ".weight");
  const std::string& name = layer.name;
  if (!files_.contains(name + ".weight"))
    throw Error("layer: no tensor " + name + ".weight in " + files_.directory());
  layer.weight = files_.get(name + ".weight");
  std::string scale_key;
  for (const char* suffix : kWeightScaleSuffixes)
    if (files_.contains(name + suffix)) {
      scale_key = name + suffix;
      break;
    }
  if (scale_key.empty())
    throw Error("layer " + name + ": expected " + name + ".weight_scale_inv next to the quantized weight, found none");
  if (layer.weight.ndim != 2)
    throw Error(name + ".weight: expected shape [N, K], got " + shape_string(layer.weight));
  TensorView scale = files_.get(scale_key);
  layer.weight_recipe = resolve_weight_recipe(quantization_, layer.weight, scale, name);
  layer.n = layer.weight.shape[0];
  layer.k = is_fp4_storage(layer.weight.dtype) ? 2 * layer.weight.shape[1] : layer.weight.shape[1];
  layer.weight_scale = reshaped(scale, weight_scale_shape(layer.weight_recipe, layer.n, layer.k));
  if (layer.weight_recipe.granularity == WeightGranularity::MX && scale.dtype == DType::U8)
    layer.weight_scale.dtype = DType::F8_E8M0;

  std::string act_key;
  for (const char* suffix : kActScaleSuffixes)
    if (files_.contains(name + suffix)) {
      act_key = name + suffix;
      break;
    }
  QuantizationConfig q = quantization_;
  // Without an activation_scheme (compressed-tensors configs), a stored input scale means static.
  if (!q.activation_scheme_given && !act_key.empty()) q.static_activations = true;
  layer.activation_recipe = resolve_activation_recipe(q, layer.weight_recipe);
  if (q.static_activations) {
    if (act_key.empty())
      throw Error("layer " + name + ": activation_scheme is static, expected " + name + ".activation_scale (or " + name +
                  ".input_scale), found neither");
    layer.act_scale = scalar_scale(files_.get(act_key), act_key, layer.owned);
    check_act_scale(layer.act_scale, act_key);
  }
  if (files_.contains(name + ".bias")) {
    layer.bias = files_.get(name + ".bias");
    if (layer.bias.ndim != 1 || layer.bias.shape[0] != layer.n)
      throw Error(name + ".bias: expected shape [" + std::to_string(layer.n) + "], got " + shape_string(layer.bias));
  }
  return layer;
}

ExpertsLayer Checkpoint::experts(const std::string& name) const {
  ExpertsLayer x;
  x.name = name;
  const bool gpt_oss = files_.contains(name + ".gate_up_proj_blocks");
  if (gpt_oss) {
    // [E, R, K/32, 16] blocks → [E, R, K/2]; uint8 exponents → F8_E8M0 (same bytes).
    auto blocks = [&](const std::string& key) {
      TensorView b = files_.get(key);
      if (b.ndim != 4 || b.shape[3] != 16 || b.dtype != DType::U8)
        throw Error(key + ": expected uint8 blocks of shape [E, N, K/32, 16], got " + std::string(dtype_name(b.dtype)) +
                    " " + shape_string(b));
      return reshaped(b, {b.shape[0], b.shape[1], b.shape[2] * 16});
    };
    auto scales = [&](const std::string& key) {
      TensorView s = files_.get(key);
      if (s.dtype != DType::U8 && s.dtype != DType::F8_E8M0)
        throw Error(ErrorKind::Type, key + ": expected uint8 UE8M0 exponents, got " + std::string(dtype_name(s.dtype)));
      s.dtype = DType::F8_E8M0;
      return s;
    };
    x.gate_up = blocks(name + ".gate_up_proj_blocks");
    x.gate_up_scale = scales(name + ".gate_up_proj_scales");
    x.down = blocks(name + ".down_proj_blocks");
    x.down_scale = scales(name + ".down_proj_scales");
    x.interleaved_gate_up = true;
    if (files_.contains(name + ".gate_up_proj_bias")) x.gate_up_bias = files_.get(name + ".gate_up_proj_bias");
    if (files_.contains(name + ".down_proj_bias")) x.down_bias = files_.get(name + ".down_proj_bias");
  } else {
    x.has_gate = files_.contains(name + ".gate_up_proj");
    const std::string up = name + (x.has_gate ? ".gate_up_proj" : ".up_proj");
    if (!files_.contains(up)) throw Error("experts: no tensor " + name + ".gate_up_proj (or .up_proj) in " + files_.directory());
    if (!files_.contains(up + "_scale_inv")) throw Error("experts " + name + ": expected " + up + "_scale_inv, found none");
    if (!files_.contains(name + ".down_proj") || !files_.contains(name + ".down_proj_scale_inv"))
      throw Error("experts " + name + ": expected " + name + ".down_proj and " + name + ".down_proj_scale_inv");
    x.gate_up = files_.get(up);
    x.gate_up_scale = files_.get(up + "_scale_inv");
    x.down = files_.get(name + ".down_proj");
    x.down_scale = files_.get(name + ".down_proj_scale_inv");
    if (files_.contains(up + "_bias")) x.gate_up_bias = files_.get(up + "_bias");
    if (files_.contains(name + ".down_proj_bias")) x.down_bias = files_.get(name + ".down_proj_bias");
  }
  for (const auto* t : {&x.gate_up, &x.down})
    if (t->ndim != 3) throw Error("experts " + name + ": expected weights of shape [E, N, K], got " + shape_string(*t));
  const WeightRecipe gate_up_recipe = resolve_weight_recipe(quantization_, x.gate_up, x.gate_up_scale, name + " gate_up_proj");
  x.weight_recipe = resolve_weight_recipe(quantization_, x.down, x.down_scale, name + " down_proj");
  if (!(gate_up_recipe == x.weight_recipe))
    throw Error("experts " + name + ": gate_up_proj is stored as " + gate_up_recipe.name() + " but down_proj as " +
                x.weight_recipe.name() + "; expected one recipe for both");
  const bool fp4 = x.weight_recipe.element == ElementType::FP4_E2M1;
  x.num_experts = x.gate_up.shape[0];
  x.hidden = x.down.shape[1];
  x.intermediate = fp4 ? 2 * x.down.shape[2] : x.down.shape[2];
  const int64_t gate_up_k = fp4 ? 2 * x.gate_up.shape[2] : x.gate_up.shape[2];
  const int64_t rows = x.gate_up.shape[1];
  if (x.down.shape[0] != x.num_experts || gate_up_k != x.hidden ||
      rows != (x.has_gate ? 2 * x.intermediate : x.intermediate))
    throw Error("experts " + name + ": gate_up_proj " + shape_string(x.gate_up) + " and down_proj " + shape_string(x.down) +
                " disagree: expected [E, " + (x.has_gate ? "2I" : "I") + ", H] and [E, H, I]");
  // Scales normalised to [E, <weight_scale_shape>].
  auto stack = [&](const TensorView& s, int64_t n, int64_t k) {
    std::vector<int64_t> shape = weight_scale_shape(x.weight_recipe, n, k);
    shape.insert(shape.begin(), x.num_experts);
    TensorView r = reshaped(s, shape);
    if (x.weight_recipe.granularity == WeightGranularity::MX && r.dtype == DType::U8) r.dtype = DType::F8_E8M0;
    return r;
  };
  x.gate_up_scale = stack(x.gate_up_scale, rows, x.hidden);
  x.down_scale = stack(x.down_scale, x.hidden, x.intermediate);

  QuantizationConfig q = quantization_;
  const std::string gu_act = name + ".gate_up_proj_activation_scale", dn_act = name + ".down_proj_activation_scale";
  if (!q.activation_scheme_given && files_.contains(gu_act)) q.static_activations = true;
  x.activation_recipe = resolve_activation_recipe(q, x.weight_recipe);
  if (q.static_activations) {
    for (const auto& [key, out] : {std::pair{gu_act, &x.gate_up_act_scale}, {dn_act, &x.down_act_scale}}) {
      if (!files_.contains(key))
        throw Error("experts " + name + ": activation_scheme is static, expected " + key + " [" +
                    std::to_string(x.num_experts) + "], found none");
      TensorView s = files_.get(key);
      if (s.dtype != DType::F32 || s.numel() != x.num_experts)
        throw Error(key + ": expected float32 [" + std::to_string(x.num_experts) + "], got " +
                    std::string(dtype_name(s.dtype)) + " " + shape_string(s));
      *out = reshaped(s, {x.num_experts});
      for (int64_t e = 0; e < x.num_experts; ++e) {
        const float v = static_cast<const float*>(s.data)[e];
        if (!(v > 0.0f) || !std::isfinite(v))
          throw Error(key + "[" + std::to_string(e) + "]: expected a finite positive activation scale, got " + std::to_string(v));
      }
    }
  }

  x.swiglu_limit = moe_.swiglu_limit;
  const std::string& act = moe_.hidden_act;
  if (!x.has_gate) {
    x.activation = act.rfind("gelu", 0) == 0 ? MoeActivation::Gelu
                   : act == "relu2"          ? MoeActivation::Relu2
                                             : MoeActivation::Silu;
  } else if (gpt_oss || moe_.swiglu_alpha != 0.0f) {
    x.activation = MoeActivation::SwiGLUOai;
    x.swiglu_alpha = moe_.swiglu_alpha != 0.0f ? moe_.swiglu_alpha : 1.702f;
  }
  return x;
}

}  // namespace finegemm
