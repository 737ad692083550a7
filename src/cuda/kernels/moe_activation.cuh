// The MoE activations of RECIPES.md, in float, shared by the gate_up GEMM's fused epilogue (sm90_fp8_gemm.cuh) and
// by the per-token path's activation kernel (moe_activation_kernel.cuh), so that both compute the same values.
#pragma once
#include <cstdint>

namespace finegemm::cuda {

__device__ __forceinline__ float moe_sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

// Where a row's gate and up columns lie in the gate_up output: halves (i, I + i), interleaved (2i, 2i + 1), or no
// gate (i).
enum class MoeGateLayout : int { Halves = 0, Interleaved = 1, NoGate = 2 };

// act_kind: the MoeActivation numbering (0 SwiGLU, 1 SwiGLUOai, 2 Silu, 3 Gelu, 4 Relu2).
__device__ __forceinline__ float moe_gated_act(int act_kind, float limit, float alpha, float gate, float up) {
  if (limit > 0.0f) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
  }
  if (act_kind == 1) return (up + 1.0f) * gate * moe_sigmoid(alpha * gate);
  return gate * moe_sigmoid(gate) * up;
}
__device__ __forceinline__ float moe_plain_act(int act_kind, float up) {
  switch (act_kind) {
    case 2: return up * moe_sigmoid(up);
    case 3: return 0.5f * up * (1.0f + tanhf(0.7978845608028654f * (up + 0.044715f * up * up * up)));
    default: {
      const float r = fmaxf(up, 0.0f);
      return r * r;
    }
  }
}

}  // namespace finegemm::cuda
