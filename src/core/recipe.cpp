#include "finegemm/error.hpp"
#include "finegemm/recipe.hpp"

namespace finegemm {

WeightRecipe WeightRecipe::block(int block_n, int block_k, ScaleFormat fmt) {
  return {WeightGranularity::Block, ElementType::FP8_E4M3, fmt, block_n, block_k};
}
WeightRecipe WeightRecipe::per_channel() { return {WeightGranularity::PerChannel, ElementType::FP8_E4M3, ScaleFormat::FP32, 1, 0}; }
WeightRecipe WeightRecipe::per_tensor() { return {WeightGranularity::PerTensor, ElementType::FP8_E4M3, ScaleFormat::FP32, 0, 0}; }
WeightRecipe WeightRecipe::mxfp4(ScaleFormat fmt) { return {WeightGranularity::MX, ElementType::FP4_E2M1, fmt, 1, 32}; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t WeightRecipe::scale_rows(int64_t n) const {
  switch (granularity) {
    case WeightGranularity::PerTensor: return 1;
    case WeightGranularity::PerChannel: return n;
    case WeightGranularity::Block: return ceil_div(n, block_n);
    case WeightGranularity::MX: return n;
  }
  return 0;
}

int64_t WeightRecipe::scale_cols(int64_t k) const {
  switch (granularity) {
    case WeightGranularity::PerTensor:
    case WeightGranularity::PerChannel: return 1;
    case WeightGranularity::Block: return ceil_div(k, block_k);
    case WeightGranularity::MX: return ceil_div(k, 32);
  }
  return 0;
}

static const char* scale_format_name(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::FP32: return "fp32";
    case ScaleFormat::UE8M0: return "ue8m0";
    case ScaleFormat::UE8M0_PACKED: return "ue8m0x4";
  }
  return "?";
}

std::string WeightRecipe::name() const {
  std::string elem = element == ElementType::FP4_E2M1 ? "fp4-" : "";
  switch (granularity) {
    case WeightGranularity::PerTensor: return elem + "tensor/" + scale_format_name(scale_format);
    case WeightGranularity::PerChannel: return elem + "channel/" + scale_format_name(scale_format);
    case WeightGranularity::Block:
      return elem + "block" + std::to_string(block_n) + "x" + std::to_string(block_k) + "/" + scale_format_name(scale_format);
    case WeightGranularity::MX:
      return std::string(element == ElementType::FP4_E2M1 ? "mxfp4/" : "mx1x32/") + scale_format_name(scale_format);
  }
  return "?";
}

ActivationRecipe ActivationRecipe::per_token_group(int group_size, bool pow2_scale) {
  return {ActGranularity::PerTokenGroup, group_size, pow2_scale};
}
ActivationRecipe ActivationRecipe::per_token(bool pow2_scale) { return {ActGranularity::PerToken, 0, pow2_scale}; }
ActivationRecipe ActivationRecipe::static_per_tensor() { return {ActGranularity::StaticPerTensor, 0, false}; }

std::string ActivationRecipe::name() const {
  const std::string pow2 = pow2_scale ? "-pow2" : "";
  switch (granularity) {
    case ActGranularity::PerTokenGroup: return "group" + std::to_string(group_size) + pow2;
    case ActGranularity::PerToken: return "token" + pow2;
    case ActGranularity::StaticPerTensor: return "static";
  }
  return "?";
}

std::vector<int64_t> weight_scale_shape(const WeightRecipe& recipe, int64_t n, int64_t k) {
  switch (recipe.granularity) {
    case WeightGranularity::PerTensor: return {};
    case WeightGranularity::PerChannel: return {n};
    case WeightGranularity::Block:
    case WeightGranularity::MX: {
      const int64_t cols = recipe.scale_cols(k);
      return {recipe.scale_rows(n), recipe.scale_format == ScaleFormat::UE8M0_PACKED ? ceil_div(cols, 4) : cols};
    }
  }
  return {};
}

DType weight_scale_dtype(const WeightRecipe& recipe) {
  switch (recipe.scale_format) {
    case ScaleFormat::FP32: return DType::F32;
    case ScaleFormat::UE8M0: return DType::F8_E8M0;
    case ScaleFormat::UE8M0_PACKED: return DType::I32;
  }
  return DType::F32;
}

int64_t weight_storage_cols(const WeightRecipe& recipe, int64_t k) {
  return recipe.element == ElementType::FP4_E2M1 ? k / 2 : k;
}

std::vector<int64_t> activation_scale_shape(const ActivationRecipe& recipe, int64_t m, int64_t k) {
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup: return {m, recipe.group_size > 0 ? k / recipe.group_size : 0};
    case ActGranularity::PerToken: return {m};
    case ActGranularity::StaticPerTensor: return {};
  }
  return {};
}

std::vector<NamedRecipe> all_recipes() {
  using A = ActivationRecipe;
  using W = WeightRecipe;
  std::vector<NamedRecipe> r;
  auto add = [&](W w, A a) { r.push_back({w.name() + " x " + a.name(), w, a}); };
  // DeepSeek-V3/R1, Qwen3 FP8, MiniMax-M2: block 128×128, dynamic group-128 (FP32 or UE8M0 scales).
  add(W::block(128, 128, ScaleFormat::FP32), A::per_token_group(128));
  add(W::block(128, 128, ScaleFormat::UE8M0), A::per_token_group(128, true));
  add(W::block(128, 128, ScaleFormat::UE8M0_PACKED), A::per_token_group(128, true));
  // Mixed: UE8M0 weights with FP32 activation scales, and the reverse.
  add(W::block(128, 128, ScaleFormat::UE8M0), A::per_token_group(128));
  add(W::block(128, 128, ScaleFormat::FP32), A::per_token_group(128, true));
  // Static activation scales (transformers activation_scheme="static").
  add(W::block(128, 128, ScaleFormat::FP32), A::static_per_tensor());
  add(W::block(128, 128, ScaleFormat::UE8M0), A::static_per_tensor());
  // Other block shapes transformers' weight_block_size accepts.
  add(W::block(64, 128, ScaleFormat::FP32), A::per_token_group(128));
  add(W::block(32, 32, ScaleFormat::FP32), A::per_token_group(32));
  // llm-compressor FP8_DYNAMIC and FP8 (static), Llama-3.x-FP8.
  add(W::per_channel(), A::per_token());
  add(W::per_tensor(), A::static_per_tensor());
  add(W::per_tensor(), A::per_token());
  // FP4 experts: DeepSeek-V4 (UE8M0), GPT-OSS MXFP4; FP32 scales too.
  add(W::mxfp4(ScaleFormat::UE8M0), A::per_token_group(32));
  add(W::mxfp4(ScaleFormat::UE8M0), A::per_token_group(128, true));
  add(W::mxfp4(ScaleFormat::FP32), A::per_token_group(128));
  add(W::mxfp4(ScaleFormat::UE8M0), A::static_per_tensor());
  return r;
}

}  // namespace finegemm
