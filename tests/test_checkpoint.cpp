// config.json parsing (quantization_config defaults and each field, MoE fields) and layer discovery for every
// checkpoint layout finegemm reads: transformers FP8 linear/experts, per-channel/per-tensor, static scales under both
// names, DeepSeek-V4 FP4 experts and GPT-OSS MXFP4 blocks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "finegemm/checkpoint.hpp"
#include "testing.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using finegemm::ActivationRecipe;
using finegemm::DType;
using finegemm::Error;
using finegemm::ScaleFormat;
using finegemm::WeightRecipe;
using finegemm::testing::Buffer;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("finegemm_ck_" + std::to_string(::getpid()) + "_" + std::to_string(finegemm::testing::rng()() % 1000000));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

Buffer filled(DType dtype, std::vector<int64_t> shape, float value) {
  Buffer b(dtype, std::move(shape));
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (dtype == DType::F32) b.ptr<float>()[i] = value;
    else std::memset(b.bytes.data(), static_cast<int>(value), b.bytes.size());
  }
  return b;
}

// Writes tensors + config into a fresh directory and opens it.
struct Fixture {
  TempDir dir;
  std::vector<Buffer> buffers;
  std::vector<finegemm::NamedTensor> named;
  void add(const std::string& name, Buffer b) {
    buffers.push_back(std::move(b));
    named.push_back({name, {}});
  }
  finegemm::Checkpoint open(const json& config) {
    for (size_t i = 0; i < named.size(); ++i) named[i].tensor = buffers[i].view;
    finegemm::save_safetensors((dir.path / "model.safetensors").string(), named);
    std::ofstream(dir.path / "config.json") << config.dump();
    return finegemm::Checkpoint::open(dir.path.string());
  }
};

json fp8_config(json qc) { return {{"model_type", "deepseek_v3"}, {"quantization_config", qc}}; }

}  // namespace

TEST(QuantizationConfig, DefaultsAndEachField) {
  const auto none = finegemm::parse_quantization_config("{}");
  EXPECT_FALSE(none.present);

  const auto defaults = finegemm::parse_quantization_config(R"({"quantization_config": {"quant_method": "fp8"}})");
  EXPECT_TRUE(defaults.present);
  EXPECT_EQ(defaults.quant_method, "fp8");
  EXPECT_FALSE(defaults.static_activations);
  EXPECT_FALSE(defaults.activation_scheme_given);
  EXPECT_TRUE(defaults.has_block_size);
  EXPECT_EQ(defaults.block_n, 128);
  EXPECT_EQ(defaults.block_k, 128);
  EXPECT_EQ(defaults.fmt, "e4m3");
  EXPECT_FALSE(defaults.ue8m0_scales);

  const auto full = finegemm::parse_quantization_config(
      R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [64, 32],
          "fmt": "e4m3", "scale_fmt": "ue8m0", "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate$"]}})");
  EXPECT_TRUE(full.static_activations);
  EXPECT_TRUE(full.activation_scheme_given);
  EXPECT_EQ(full.block_n, 64);
  EXPECT_EQ(full.block_k, 32);
  EXPECT_TRUE(full.ue8m0_scales);
  EXPECT_EQ(full.modules_to_not_convert, (std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate$"}));

  const auto null_block = finegemm::parse_quantization_config(R"({"quantization_config": {"weight_block_size": null}})");
  EXPECT_FALSE(null_block.has_block_size);
  const auto gpt_oss = finegemm::parse_quantization_config(R"({"quantization_config": {"quant_method": "mxfp4"}})");
  EXPECT_EQ(gpt_oss.fmt, "e2m1");

  for (const char* bad : {R"({"quantization_config": {"activation_scheme": "sometimes"}})",
                          R"({"quantization_config": {"weight_block_size": [128]}})",
                          R"({"quantization_config": {"weight_block_size": [0, 128]}})",
                          R"({"quantization_config": {"weight_block_size": "128"}})",
                          R"({"quantization_config": {"scale_fmt": "e5m2"}})",
                          R"({"quantization_config": {"fmt": "e5m2"}})", R"({"quantization_config": 3})", "not json",
                          "[1]"})
    EXPECT_THROW(finegemm::parse_quantization_config(bad), Error) << bad;
  try {
    finegemm::parse_quantization_config(R"({"quantization_config": {"weight_block_size": [128, -1]}})");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_block_size: expected [block_n, block_k]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[128,-1]"), std::string::npos) << e.what();
  }
}

TEST(QuantizationConfig, ActivationRecipes) {
  auto q = finegemm::parse_quantization_config(R"({"quantization_config": {}})");
  EXPECT_EQ(finegemm::resolve_activation_recipe(q, WeightRecipe::block()), ActivationRecipe::per_token_group(128));
  q.ue8m0_scales = true;
  EXPECT_EQ(finegemm::resolve_activation_recipe(q, WeightRecipe::block(64, 32)), ActivationRecipe::per_token_group(32, true));
  EXPECT_EQ(finegemm::resolve_activation_recipe(q, WeightRecipe::per_channel()), ActivationRecipe::per_token(true));
  q.static_activations = true;
  EXPECT_EQ(finegemm::resolve_activation_recipe(q, WeightRecipe::block()), ActivationRecipe::static_per_tensor());
  const auto gpt_oss = finegemm::parse_quantization_config(R"({"quantization_config": {"quant_method": "mxfp4"}})");
  EXPECT_EQ(finegemm::resolve_activation_recipe(gpt_oss, WeightRecipe::mxfp4()), ActivationRecipe::per_token_group(32));
}

TEST(MoeConfig, Fields) {
  const auto ds = finegemm::parse_moe_config(
      R"({"model_type": "deepseek_v3", "hidden_size": 7168, "moe_intermediate_size": 2048, "intermediate_size": 18432,
          "n_routed_experts": 256, "num_experts_per_tok": 8, "hidden_act": "silu"})");
  EXPECT_EQ(ds.hidden_size, 7168);
  EXPECT_EQ(ds.intermediate_size, 2048);
  EXPECT_EQ(ds.num_experts, 256);
  EXPECT_EQ(ds.top_k, 8);
  EXPECT_EQ(ds.swiglu_limit, 0.0f);
  const auto oss = finegemm::parse_moe_config(
      R"({"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 128,
          "experts_per_token": 4, "swiglu_limit": 7.0})");
  EXPECT_EQ(oss.num_experts, 128);
  EXPECT_EQ(oss.top_k, 4);
  EXPECT_FLOAT_EQ(oss.swiglu_limit, 7.0f);
  EXPECT_FLOAT_EQ(oss.swiglu_alpha, 1.702f);
  const auto qwen = finegemm::parse_moe_config(
      R"({"text_config": {"hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
          "expert_dtype": "fp4", "swiglu_limit": 10, "swiglu_alpha": 1.5}})");
  EXPECT_EQ(qwen.hidden_size, 2048);
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_TRUE(qwen.fp4_experts);
  EXPECT_FLOAT_EQ(qwen.swiglu_alpha, 1.5f);
  EXPECT_THROW(finegemm::parse_moe_config(R"({"hidden_size": "big"})"), Error);
  EXPECT_THROW(finegemm::parse_moe_config(R"({"hidden_size": -3})"), Error);
}

TEST(Checkpoint, LinearLayersEveryScaleLayout) {
  Fixture f;
  const int64_t n = 256, k = 384;
  f.add("a.weight", Buffer(DType::F8_E4M3, {n, k}));
  f.add("a.weight_scale_inv", filled(DType::F32, {2, 3}, 0.01f));
  f.add("a.bias", Buffer(DType::BF16, {n}));
  f.add("ch.weight", Buffer(DType::F8_E4M3, {n, k}));
  f.add("ch.weight_scale", filled(DType::F32, {n, 1}, 0.01f));  // llm-compressor's name and [N, 1] shape
  f.add("pt.weight", Buffer(DType::F8_E4M3, {n, k}));
  f.add("pt.weight_scale_inv", filled(DType::F32, {}, 0.02f));
  f.add("ue.weight", Buffer(DType::F8_E4M3, {n, k}));
  f.add("ue.weight_scale_inv", filled(DType::F8_E8M0, {2, 3}, 120));
  f.add("fp4.weight", Buffer(DType::I8, {n, k / 2}));
  f.add("fp4.weight_scale_inv", filled(DType::F8_E8M0, {n, k / 32}, 127));
  f.add("embed.weight", Buffer(DType::BF16, {10, k}));
  const auto ckpt = f.open(fp8_config({{"quant_method", "fp8"}, {"scale_fmt", "ue8m0"}}));
  EXPECT_EQ(ckpt.linear_layers(), (std::vector<std::string>{"a", "ch", "fp4", "pt", "ue"}));

  const auto a = ckpt.linear("a.weight");
  EXPECT_EQ(a.weight_recipe, WeightRecipe::block(128, 128, ScaleFormat::FP32));
  EXPECT_EQ(a.activation_recipe, ActivationRecipe::per_token_group(128, true));
  EXPECT_EQ(a.n, n);
  EXPECT_EQ(a.k, k);
  EXPECT_TRUE(a.bias.defined());
  EXPECT_EQ(ckpt.linear("ch").weight_recipe, WeightRecipe::per_channel());
  EXPECT_EQ(ckpt.linear("ch").weight_scale.sizes(), (std::vector<int64_t>{n}));
  EXPECT_EQ(ckpt.linear("ch").activation_recipe, ActivationRecipe::per_token(true));
  EXPECT_EQ(ckpt.linear("pt").weight_recipe, WeightRecipe::per_tensor());
  EXPECT_EQ(ckpt.linear("pt").weight_scale.ndim, 0);
  EXPECT_EQ(ckpt.linear("ue").weight_recipe, WeightRecipe::block(128, 128, ScaleFormat::UE8M0));
  const auto fp4 = ckpt.linear("fp4");
  EXPECT_EQ(fp4.weight_recipe, WeightRecipe::mxfp4(ScaleFormat::UE8M0));
  EXPECT_EQ(fp4.k, k);
  EXPECT_FALSE(ckpt.linear("a").act_scale.defined());
  EXPECT_THROW(ckpt.linear("embed"), Error);
  EXPECT_THROW(ckpt.linear("missing"), Error);
}

TEST(Checkpoint, StaticScalesUnderBothNames) {
  Fixture f;
  f.add("x.weight", Buffer(DType::F8_E4M3, {128, 256}));
  f.add("x.weight_scale_inv", filled(DType::F32, {1, 2}, 0.01f));
  f.add("x.activation_scale", filled(DType::F32, {}, 0.5f));  // transformers' FP8Linear
  f.add("y.weight", Buffer(DType::F8_E4M3, {128, 256}));
  f.add("y.weight_scale_inv", filled(DType::F32, {1, 2}, 0.01f));
  f.add("y.input_scale", filled(DType::F32, {1}, 0.25f));  // llm-compressor / vLLM
  f.add("z.weight", Buffer(DType::F8_E4M3, {128, 256}));
  f.add("z.weight_scale_inv", filled(DType::F32, {1, 2}, 0.01f));
  f.add("bad.weight", Buffer(DType::F8_E4M3, {128, 256}));
  f.add("bad.weight_scale_inv", filled(DType::F32, {1, 2}, 0.01f));
  f.add("bad.activation_scale", filled(DType::F32, {}, -1.0f));
  const auto ckpt = f.open(fp8_config({{"activation_scheme", "static"}}));
  const auto x = ckpt.linear("x");
  EXPECT_TRUE(x.activation_recipe.is_static());
  EXPECT_EQ(x.act_scale.ptr<float>()[0], 0.5f);
  EXPECT_EQ(x.act_scale.ndim, 0);
  EXPECT_EQ(ckpt.linear("y").act_scale.ptr<float>()[0], 0.25f);
  try {
    ckpt.linear("z");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected z.activation_scale (or z.input_scale)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ckpt.linear("bad"), Error);
}

TEST(Checkpoint, WrongScaleShapeIsAClearError) {
  Fixture f;
  f.add("w.weight", Buffer(DType::F8_E4M3, {7168, 2048}));
  f.add("w.weight_scale_inv", filled(DType::F32, {56, 17}, 0.01f));
  const auto ckpt = f.open(fp8_config(json::object()));
  try {
    ckpt.linear("w");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected shape [56, 16] for N=7168, K=2048 with 128x128 blocks, got [56, 17]"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, Fp8ExpertsDynamicAndStatic) {
  const int64_t e = 4, h = 256, i = 128;
  for (const bool is_static : {false, true}) {
    Fixture f;
    f.add("m.experts.gate_up_proj", Buffer(DType::F8_E4M3, {e, 2 * i, h}));
    f.add("m.experts.gate_up_proj_scale_inv", filled(DType::F32, {e, 2, 2}, 0.01f));
    f.add("m.experts.down_proj", Buffer(DType::F8_E4M3, {e, h, i}));
    f.add("m.experts.down_proj_scale_inv", filled(DType::F32, {e, 2, 1}, 0.01f));
    if (is_static) {
      f.add("m.experts.gate_up_proj_activation_scale", filled(DType::F32, {e}, 0.1f));
      f.add("m.experts.down_proj_activation_scale", filled(DType::F32, {e}, 0.2f));
    }
    const auto ckpt = f.open({{"hidden_size", h}, {"moe_intermediate_size", i}, {"num_local_experts", e},
                              {"swiglu_limit", 10.0},
                              {"quantization_config", {{"activation_scheme", is_static ? "static" : "dynamic"}}}});
    EXPECT_EQ(ckpt.experts_layers(), (std::vector<std::string>{"m.experts"}));
    const auto x = ckpt.experts("m.experts");
    EXPECT_EQ(x.num_experts, e);
    EXPECT_EQ(x.hidden, h);
    EXPECT_EQ(x.intermediate, i);
    EXPECT_TRUE(x.has_gate);
    EXPECT_FALSE(x.interleaved_gate_up);
    EXPECT_EQ(x.activation, finegemm::MoeActivation::SwiGLU);
    EXPECT_FLOAT_EQ(x.swiglu_limit, 10.0f);
    EXPECT_EQ(x.weight_recipe, WeightRecipe::block());
    EXPECT_EQ(x.activation_recipe.is_static(), is_static);
    EXPECT_EQ(x.gate_up_act_scale.defined(), is_static);
    if (is_static) EXPECT_EQ(x.down_act_scale.ptr<float>()[3], 0.2f);
  }
}

TEST(Checkpoint, DeepSeekV4Fp4Experts) {
  const int64_t e = 2, h = 256, i = 128;
  Fixture f;
  f.add("m.gate_up_proj", Buffer(DType::I8, {e, 2 * i, h / 2}));
  f.add("m.gate_up_proj_scale_inv", filled(DType::F8_E8M0, {e, 2 * i, h / 32}, 127));
  f.add("m.down_proj", Buffer(DType::I8, {e, h, i / 2}));
  f.add("m.down_proj_scale_inv", filled(DType::F8_E8M0, {e, h, i / 32}, 127));
  const auto ckpt = f.open({{"expert_dtype", "fp4"}, {"quantization_config", {{"scale_fmt", "ue8m0"}}}});
  const auto x = ckpt.experts("m");
  EXPECT_EQ(x.weight_recipe, WeightRecipe::mxfp4(ScaleFormat::UE8M0));
  EXPECT_EQ(x.hidden, h);
  EXPECT_EQ(x.intermediate, i);
  EXPECT_EQ(x.gate_up_scale.sizes(), (std::vector<int64_t>{e, 2 * i, h / 32}));
  EXPECT_EQ(x.activation_recipe, ActivationRecipe::per_token_group(128, true));
}

TEST(Checkpoint, GptOssMxfp4Blocks) {
  const int64_t e = 2, h = 128, i = 64;
  Fixture f;
  f.add("model.layers.0.mlp.experts.gate_up_proj_blocks", Buffer(DType::U8, {e, 2 * i, h / 32, 16}));
  f.add("model.layers.0.mlp.experts.gate_up_proj_scales", filled(DType::U8, {e, 2 * i, h / 32}, 127));
  f.add("model.layers.0.mlp.experts.gate_up_proj_bias", Buffer(DType::BF16, {e, 2 * i}));
  f.add("model.layers.0.mlp.experts.down_proj_blocks", Buffer(DType::U8, {e, h, i / 32, 16}));
  f.add("model.layers.0.mlp.experts.down_proj_scales", filled(DType::U8, {e, h, i / 32}, 127));
  f.add("model.layers.0.mlp.experts.down_proj_bias", Buffer(DType::BF16, {e, h}));
  const auto ckpt = f.open({{"model_type", "gpt_oss"}, {"swiglu_limit", 7.0}, {"quantization_config", {{"quant_method", "mxfp4"}}}});
  EXPECT_EQ(ckpt.experts_layers(), (std::vector<std::string>{"model.layers.0.mlp.experts"}));
  const auto x = ckpt.experts("model.layers.0.mlp.experts");
  EXPECT_TRUE(x.interleaved_gate_up);
  EXPECT_EQ(x.activation, finegemm::MoeActivation::SwiGLUOai);
  EXPECT_FLOAT_EQ(x.swiglu_alpha, 1.702f);
  EXPECT_FLOAT_EQ(x.swiglu_limit, 7.0f);
  // The blocks are viewed as packed [E, N, K/2] without a copy; the exponents as UE8M0.
  EXPECT_EQ(x.gate_up.sizes(), (std::vector<int64_t>{e, 2 * i, h / 2}));
  EXPECT_EQ(x.gate_up.data, ckpt.files().get("model.layers.0.mlp.experts.gate_up_proj_blocks").data);
  EXPECT_EQ(x.gate_up_scale.dtype, DType::F8_E8M0);
  EXPECT_EQ(x.weight_recipe, WeightRecipe::mxfp4(ScaleFormat::UE8M0));
  EXPECT_EQ(x.activation_recipe, ActivationRecipe::per_token_group(32));
  EXPECT_EQ(x.intermediate, i);
  EXPECT_TRUE(x.gate_up_bias.defined());
  EXPECT_TRUE(x.down_bias.defined());
}
