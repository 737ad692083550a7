// Hugging Face checkpoints: config.json's quantization_config and MoE fields, and the layers stored in the
// safetensors files, resolved to finegemm recipes with views ready for linear() / moe_experts().
//
// Tensor names, as transformers 5.x's finegrained_fp8 integration holds them (FP8Linear, FP8Experts):
//   linear   <name>.weight            F8_E4M3 [N, K]
//            <name>.weight_scale_inv  F32 or F8_E8M0 [ceil(N/bn), ceil(K/bk)]; a scalar when weight_block_size is null
//            <name>.activation_scale  F32 scalar, activation_scheme "static" only (FP8Linear's parameter name;
//                                     llm-compressor, vLLM and Llama-3.x-FP8 call the same scalar `input_scale`,
//                                     and both names are read)
//   experts  <name>.gate_up_proj [E, 2I, H], <name>.gate_up_proj_scale_inv [E, ceil(2I/bn), ceil(H/bk)]
//            <name>.down_proj [E, H, I],     <name>.down_proj_scale_inv [E, ceil(H/bn), ceil(I/bk)]
//            (no gate: <name>.up_proj [E, I, H] and <name>.up_proj_scale_inv)
//            static: <name>.gate_up_proj_activation_scale [E], <name>.down_proj_activation_scale [E] (F32)
//            FP4 (config "expert_dtype": "fp4", DeepSeek-V4): the same names, weights I8 [E, 2I, H/2], scales
//            F8_E8M0 [E, 2I, H/32].
//   GPT-OSS  <name>.gate_up_proj_blocks U8 [E, 2I, H/32, 16], <name>.gate_up_proj_scales U8 [E, 2I, H/32] (UE8M0
//            exponents), <name>.gate_up_proj_bias [E, 2I]; the same for down_proj. Gate and up interleaved (even/odd).
//            The blocks are viewed as [E, 2I, H/2] and the scales as F8_E8M0, without copying.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "finegemm/moe.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/safetensors.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

// config.json → quantization_config. Missing keys take the defaults: activation_scheme "dynamic",
// weight_block_size [128, 128], fmt "e4m3", scale_fmt "float".
struct QuantizationConfig {
  bool present = false;        // config.json has a quantization_config
  std::string quant_method;    // "fp8", "mxfp4", ... ("" when absent)
  bool static_activations = false;
  bool activation_scheme_given = false;
  bool has_block_size = true;  // false: "weight_block_size": null (per-tensor or per-channel, by the scale's shape)
  int block_n = 128;
  int block_k = 128;
  std::string fmt = "e4m3";    // "e4m3" FP8 weights; "e2m1" FP4 MX weights (what `finegemm quantize --weights mxfp4` writes)
  bool ue8m0_scales = false;   // scale_fmt "ue8m0": dynamic activation scales are rounded up to powers of two
  std::vector<std::string> modules_to_not_convert;
};
QuantizationConfig parse_quantization_config(const std::string& config_json);

// The MoE fields of config.json (top level, or "text_config" for multimodal models). 0 / "" when absent.
struct MoeConfig {
  std::string model_type;
  std::string hidden_act;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // moe_intermediate_size, else intermediate_size
  int64_t num_experts = 0;        // n_routed_experts | num_experts | num_local_experts
  int64_t top_k = 0;              // num_experts_per_tok | experts_per_token
  float swiglu_limit = 0.0f;      // 0: no clamp
  float swiglu_alpha = 0.0f;      // non-zero: the GPT-OSS activation (gpt_oss defaults to 1.702)
  bool fp4_experts = false;       // "expert_dtype": "fp4"
};
MoeConfig parse_moe_config(const std::string& config_json);

// Resolves the recipe of stored tensors: the config says what it can, the tensors' dtypes and shapes say the rest
// (FP4 vs FP8, per-tensor vs per-channel vs block, FP32 vs UE8M0 scales). `weight`/`scale` are one layer's
// ([N, K] / K/2) or one expert stack's ([E, N, K]) tensors; `name` is used in error messages.
WeightRecipe resolve_weight_recipe(const QuantizationConfig& config, const TensorView& weight, const TensorView& scale,
                                   const std::string& name);
ActivationRecipe resolve_activation_recipe(const QuantizationConfig& config, const WeightRecipe& weight_recipe);

struct LinearLayer {
  std::string name;
  int64_t n = 0, k = 0;
  TensorView weight;        // [N, K] F8_E4M3 or [N, K/2] packed FP4
  TensorView weight_scale;  // normalised to weight_scale_shape(weight_recipe, N, K)
  TensorView act_scale;     // static: F32 scalar; otherwise left out
  TensorView bias;          // optional [N]
  WeightRecipe weight_recipe;
  ActivationRecipe activation_recipe;
  std::shared_ptr<void> owned;  // keeps converted scalars alive
};

struct ExpertsLayer {
  std::string name;
  int64_t num_experts = 0, hidden = 0, intermediate = 0;
  bool has_gate = true;
  bool interleaved_gate_up = false;  // GPT-OSS
  TensorView gate_up, gate_up_scale, down, down_scale;
  TensorView gate_up_act_scale, down_act_scale;  // static: [E] F32
  TensorView gate_up_bias, down_bias;            // optional
  WeightRecipe weight_recipe;
  ActivationRecipe activation_recipe;
  MoeActivation activation = MoeActivation::SwiGLU;
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  std::shared_ptr<void> owned;
};

// A model directory (or one .safetensors file) with its config, and its quantized layers.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);
  // Over files already opened (tests).
  static Checkpoint from_files(ModelFiles files);

  const ModelFiles& files() const { return files_; }
  const QuantizationConfig& quantization() const { return quantization_; }
  const MoeConfig& moe() const { return moe_; }

  // Names (without the ".weight" suffix) of quantized linear layers: `<name>.weight` stored as FP8/FP4 next to a
  // `<name>.weight_scale_inv` (or `<name>.weight_scale`).
  std::vector<std::string> linear_layers() const;
  // Names of expert stacks: `<name>.gate_up_proj` / `<name>.up_proj` / `<name>.gate_up_proj_blocks` with `down_proj`.
  std::vector<std::string> experts_layers() const;

  LinearLayer linear(const std::string& name) const;  // "<name>" or "<name>.weight"
  ExpertsLayer experts(const std::string& name) const;

 private:
  ModelFiles files_;
  QuantizationConfig quantization_;
  MoeConfig moe_;
};

}  // namespace finegemm
