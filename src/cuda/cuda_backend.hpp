// The CUDA backend's entry points (host code; no CUDA headers here).
// Arguments arrive validated (src/core/validate.cpp).
#pragma once
#include "finegemm/linear.hpp"
#include "finegemm/moe.hpp"
#include "finegemm/quantize.hpp"

namespace finegemm::cuda {

bool device_present();
void quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                          const TensorView& x_scale, void* stream);
// weights_static: RunOptions::weights_static.
void linear(const LinearArgs& args, void* stream, bool weights_static = false);
// weights_constant: RunOptions::weights_constant.
void moe_experts(const MoeArgs& args, void* stream, bool weights_constant = false);

}  // namespace finegemm::cuda
