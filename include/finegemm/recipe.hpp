// Quantization recipes: how weights and activations are stored and scaled.
// All scales are dequantization multipliers: real ≈ q · s.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "finegemm/tensor.hpp"

namespace finegemm {

enum class ElementType : uint8_t { FP8_E4M3, FP4_E2M1 };

enum class ScaleFormat : uint8_t {
  FP32,          // float32 scales
  UE8M0,         // one byte per scale, 2^(e-127)
  UE8M0_PACKED,  // four consecutive K-scales per int32, byte j = group 4i+j
};

enum class WeightGranularity : uint8_t {
  PerTensor,   // one scalar
  PerChannel,  // one scale per output row: [N] or [N, 1]
  Block,       // [ceil(N/block_n), K/block_k]
  MX,          // block 1×32 along K: [N, K/32] (FP4 E2M1 checkpoints)
};

struct WeightRecipe {
  WeightGranularity granularity = WeightGranularity::Block;
  ElementType element = ElementType::FP8_E4M3;
  ScaleFormat scale_format = ScaleFormat::FP32;
  int block_n = 128;  // Block: any positive pair; MX: 1×32
  int block_k = 128;

  static WeightRecipe block(int block_n = 128, int block_k = 128, ScaleFormat fmt = ScaleFormat::FP32);
  static WeightRecipe per_channel();
  static WeightRecipe per_tensor();
  static WeightRecipe mxfp4(ScaleFormat fmt = ScaleFormat::UE8M0);

  // Rows and columns of the weight one scale covers (PerTensor: n×k, PerChannel: 1×k).
  int64_t scale_rows(int64_t n) const;   // number of scale rows
  int64_t scale_cols(int64_t k) const;   // number of scales along K (before packing)
  std::string name() const;              // "block128x128/fp32", "mxfp4/ue8m0", ...
  bool operator==(const WeightRecipe&) const = default;
};

enum class ActGranularity : uint8_t {
  PerTokenGroup,    // dynamic, one scale per (row, group of group_size along K)
  PerToken,         // dynamic, one scale per row
  StaticPerTensor,  // one scalar from the checkpoint
};

struct ActivationRecipe {
  ActGranularity granularity = ActGranularity::PerTokenGroup;
  int group_size = 128;     // PerTokenGroup: 32 or 128
  bool pow2_scale = false;  // dynamic scales rounded up to a power of two (UE8M0)

  static ActivationRecipe per_token_group(int group_size = 128, bool pow2_scale = false);
  static ActivationRecipe per_token(bool pow2_scale = false);
  static ActivationRecipe static_per_tensor();

  bool is_static() const { return granularity == ActGranularity::StaticPerTensor; }
  std::string name() const;  // "group128", "group128-pow2", "token", "static"
  bool operator==(const ActivationRecipe&) const = default;
};

// Expected scale tensors, for allocating and for error messages.
std::vector<int64_t> weight_scale_shape(const WeightRecipe& recipe, int64_t n, int64_t k);
DType weight_scale_dtype(const WeightRecipe& recipe);
// Last dim of the stored weight: K for FP8, K/2 for packed FP4.
int64_t weight_storage_cols(const WeightRecipe& recipe, int64_t k);
// Dynamic recipes: [M, K/group] or [M]; static: [] (a scalar).
std::vector<int64_t> activation_scale_shape(const ActivationRecipe& recipe, int64_t m, int64_t k);

// Every recipe of RECIPES.md, with a stable name: what `finegemm check` walks.
struct NamedRecipe {
  std::string name;
  WeightRecipe weight;
  ActivationRecipe activation;
};
std::vector<NamedRecipe> all_recipes();

}  // namespace finegemm
