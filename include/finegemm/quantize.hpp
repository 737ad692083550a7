// Quantization ops: high precision → FP8/FP4 with scales, per recipe.
#pragma once
#include "finegemm/backend.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

// x [M, K] F32/BF16/F16 → x_q [M, K] F8_E4M3 and x_scale (F32):
//   PerTokenGroup: x_scale [M, K/group] is written; PerToken: [M] is written;
//   StaticPerTensor: x_scale [] (or [1]) is read, q = sat(x / s).
void quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                          const TensorView& x_scale, const RunOptions& options = {});
void validate_quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                                   const TensorView& x_scale);

// w [N, K] F32/BF16/F16 → w_q ([N, K] F8_E4M3, or [N, K/2] U8/I8 packed FP4) and w_scale
// (shape and dtype from weight_scale_shape / weight_scale_dtype).
void quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q,
                      const TensorView& w_scale, const RunOptions& options = {});
void validate_quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q,
                               const TensorView& w_scale);

// w_q/w_scale → w [N, K] F32 (or BF16/F16). Used by the reference, the tests and the quantizer.
void dequantize_weights(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& recipe,
                        const TensorView& w, const RunOptions& options = {});

}  // namespace finegemm
