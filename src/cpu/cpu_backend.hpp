// The CPU backend: a reference (double accumulation, plain loops) and a fast path.
// Arguments arrive validated (src/core/validate.cpp).
#pragma once
#include "finegemm/linear.hpp"
#include "finegemm/moe.hpp"
#include "finegemm/quantize.hpp"

namespace finegemm::cpu {

// Reference: the definition every other backend is tested against.
void reference_quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                                    const TensorView& x_scale);
void reference_quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q,
                                const TensorView& w_scale);
void reference_dequantize_weights(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& recipe,
                                  const TensorView& w);
void reference_linear(const LinearArgs& args);
void reference_moe(const MoeArgs& args);

// Fast path: OpenMP, weights dequantized tile by tile, never whole.
void fast_linear(const LinearArgs& args);
void fast_moe(const MoeArgs& args);

}  // namespace finegemm::cpu
