// The activation of the MoE per-token path, between the gate_up GEMM (which stores its F32 output) and the
// per-token requantization of the intermediate: one row's amax spans every column tile, so it cannot be fused into
// the GEMM's epilogue as the group and static recipes are.
#pragma once
#include <cstdint>

#include "cuda/kernels/moe_activation.cuh"

namespace finegemm::cuda {

// Per-token path: h[r, i] = act(y[r, gate(i)], y[r, up(i)]) from the gate_up GEMM's output y [rows, ld] (F32, bias
// and scales applied); gate/up columns: halves (i, I + i), interleaved (2i, 2i + 1), or no gate (i).
// Rows at or past *routed_rows (the device-side count of routed rows) get zeros: their y was never written.
// NOTE: a plain __global__ in a header: included by moe.cu only (a second includer would define it twice).
__global__ void moe_activation_kernel(const float* __restrict__ y, int64_t ld, int64_t rows, int64_t inter,
                                      MoeGateLayout layout, int act_kind, float limit, float alpha,
                                      const int32_t* __restrict__ routed_rows, float* __restrict__ h) {
  const int64_t total = rows * inter;
  const int64_t routed = *routed_rows;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / inter, i = idx - r * inter;
    float v = 0.0f;
    if (r < routed) {
      const float* row = y + r * ld;
      switch (layout) {
        case MoeGateLayout::Halves: v = moe_gated_act(act_kind, limit, alpha, row[i], row[inter + i]); break;
        case MoeGateLayout::Interleaved: v = moe_gated_act(act_kind, limit, alpha, row[2 * i], row[2 * i + 1]); break;
        case MoeGateLayout::NoGate: v = moe_plain_act(act_kind, row[i]); break;
      }
    }
    h[idx] = v;
  }
}

}  // namespace finegemm::cuda
