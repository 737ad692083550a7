// y = dequant(x_q, s_x) · dequant(W_q, s_W)ᵀ (+ bias)
#pragma once
#include "finegemm/backend.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

struct LinearArgs {
  // [M, K]. F32/BF16/F16: quantized on the fly per `activation`.
  // F8_E4M3: already quantized; `x_scale` then holds its scales (activation_scale_shape).
  TensorView x;
  // Static recipe: the scalar input scale (F32, [] or [1]). Pre-quantized x: its scales; token-group scales
  // [M, K/group] may be row-major or M-major (strides [1, ld] with ld >= M: cuBLASLt's and DeepGEMM's layout, which
  // the GPU GEMM copies per stage in one bulk copy where M % 4 == 0 and ld % 4 == 0). Otherwise left out.
  TensorView x_scale;
  ActivationRecipe activation;

  TensorView weight;        // [N, K] F8_E4M3, or [N, K/2] U8/I8 packed FP4
  TensorView weight_scale;  // weight_scale_shape(weight_recipe, N, K), weight_scale_dtype
  WeightRecipe weight_recipe;

  TensorView bias;  // optional [N], F32/BF16/F16
  TensorView out;   // [M, N] BF16/F16/F32
};

void linear(const LinearArgs& args, const RunOptions& options = {});
// Checks every argument; throws finegemm::Error naming the argument, what was expected and what was given.
void validate_linear(const LinearArgs& args);

}  // namespace finegemm
