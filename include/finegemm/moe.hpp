// The Mixture-of-Experts block of transformers' FP8Experts:
//   out[t] = Σ_j w[t,j] · down_e( act( gate_up_e(x[t]) ) ),  e = top_k_index[t,j], -1 slots skipped.
#pragma once
#include "finegemm/backend.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm {

enum class MoeActivation : uint8_t {
  SwiGLU,     // silu(gate) · up  (with limit L: gate = min(gate, L), up = clamp(up, -L, L))
  SwiGLUOai,  // GPT-OSS: (up + 1) · gate · sigmoid(alpha · gate), same clamps
  Silu,       // no gate: silu(up)
  Gelu,       // no gate: gelu(up) (tanh approximation)
  Relu2,      // no gate: relu(up)²
};
bool moe_activation_has_gate(MoeActivation act);
const char* moe_activation_name(MoeActivation act);

struct MoeArgs {
  TensorView hidden;         // [T, H] F32/BF16/F16
  // [T, k] I32/I64, -1 = skip. CPU tensors: any other value outside [0, E) is an Error. CUDA tensors are not read
  // on the host (that would need a synchronisation): such entries are skipped like -1, never read out of bounds.
  TensorView top_k_index;
  TensorView top_k_weights;  // [T, k] F32/BF16/F16

  // Gated: [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up, or interleaved even/odd); no gate: [E, I, H].
  // FP4: last dim H/2. Scales: [E, <weight_scale_shape(2I, H)>].
  TensorView gate_up;
  TensorView gate_up_scale;
  TensorView down;  // [E, H, I] (FP4: [E, H, I/2]); scales [E, <weight_scale_shape(H, I)>]
  TensorView down_scale;
  WeightRecipe weight_recipe;

  // One recipe for both projections' inputs; the intermediate is requantized per it.
  ActivationRecipe activation_recipe;
  TensorView gate_up_act_scale;  // static: [E] F32
  TensorView down_act_scale;     // static: [E] F32

  TensorView gate_up_bias;  // optional [E, 2I] (GPT-OSS), F32/BF16
  TensorView down_bias;     // optional [E, H]

  MoeActivation activation = MoeActivation::SwiGLU;
  float swiglu_limit = 0.0f;  // 0: no clamp
  float swiglu_alpha = 1.702f;
  bool interleaved_gate_up = false;  // GPT-OSS native layout: gate = even rows, up = odd rows

  TensorView out;  // [T, H] BF16/F16/F32
};

void moe_experts(const MoeArgs& args, const RunOptions& options = {});
void validate_moe(const MoeArgs& args);

}  // namespace finegemm
