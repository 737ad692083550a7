// The activation of the MoE per-token path, between the gate_up GEMM (which stores its F32 output) and the
// per-token requantization of the intermediate: one row's amax spans every column tile, so it cannot be fused into
// the GEMM's epilogue as the group and static recipes are.
#pragma once
#include <cstdint>

#include "cuda/kernels/moe_activation.cuh"
#include "cuda/kernels/quant_activations.cuh"

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

// Group and static recipes, unfused path (FINEGEMM_MOE_UNFUSED): the activation and the requantization of the
// intermediate in one pass over the gate_up GEMM's F32 output y [rows, ld]: h_q [rows, inter] E4M3 and, for groups
// of kGroup columns, h_scale [rows, inter / kGroup] (kGroup 0: the static scales, one per expert: static_scale[e]
// for the rows offsets[e] .. offsets[e + 1] - 1). Each thread makes 8
// consecutive columns of h; a group's kGroup / 8 threads are adjacent lanes and reduce its amax by shuffles. The
// arithmetic is quant_activations.cuh's (dynamic_scale, quantize8), so the codes are the CPU reference's x / s.
// Rows at or past offsets[num_experts] (the routed rows) quantize zeros.
// T: the gate_up output's dtype (float; a BF16 scratch measured past the 1e-2 bar, see moe.cu).
template <int kGroup, bool kPow2, typename T = float>
__global__ void __launch_bounds__(256) moe_activation_quantize_kernel(
    const T* __restrict__ y, int64_t ld, int64_t rows, int64_t inter, MoeGateLayout layout, int act_kind,
    float limit, float alpha, const int32_t* __restrict__ offsets, int num_experts,
    const float* __restrict__ static_scale, uint8_t* __restrict__ h_q, float* __restrict__ h_scale) {
  constexpr int kLanes = kGroup == 0 ? 1 : kGroup / 8;
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a group spans 8..256 columns");
  const int64_t vecs_per_row = inter / 8, total = rows * vecs_per_row;
  const int64_t routed = offsets[num_experts];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // The loop bound is warp-uniform (every lane runs the shuffles); total is a multiple of kLanes, so a group's lanes
  // are all in range or all past it.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - lane; base < total; base += stride) {
    const int64_t idx = base + lane;
    const bool valid = idx < total;
    const int64_t r = valid ? idx / vecs_per_row : 0, c = (valid ? idx - r * vecs_per_row : 0) * 8;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    if (valid && r < routed) {
      const T* row = y + r * ld;
      if (layout == MoeGateLayout::Interleaved) {
        Vec8<T> a, b;
        a.load_streaming(row + 2 * c);
        b.load_streaming(row + 2 * c + 8);
        float g[16];
        a.to_float(*reinterpret_cast<float(*)[8]>(g));
        b.to_float(*reinterpret_cast<float(*)[8]>(g + 8));
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = moe_gated_act(act_kind, limit, alpha, g[2 * j], g[2 * j + 1]);
      } else if (layout == MoeGateLayout::Halves) {
        Vec8<T> gate, up;
        gate.load_streaming(row + c);
        up.load_streaming(row + inter + c);
        float g[8], u[8];
        gate.to_float(g);
        up.to_float(u);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = moe_gated_act(act_kind, limit, alpha, g[j], u[j]);
      } else {
        Vec8<T> up;
        up.load_streaming(row + c);
        float u[8];
        up.to_float(u);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = moe_plain_act(act_kind, u[j]);
      }
    }
    float s;
    if constexpr (kGroup == 0) {
      // The row's expert: the last e with offsets[e] <= r (rows past the routed ones take the last expert's).
      int lo = 0, hi = num_experts - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= r) lo = mid; else hi = mid - 1;
      }
      s = static_scale[lo];
    } else {
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
      for (int off = kLanes / 2; off >= 1; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
      s = dynamic_scale(amax, kPow2);
    }
    if (!valid) continue;
    uint2 codes;
    if (!quantize8_fast<kPow2>(v, s, reciprocal_of_scale<kPow2>(s), codes)) codes = quantize8(v, s);
    *reinterpret_cast<uint2*>(h_q + r * inter + c) = codes;
    if constexpr (kGroup != 0) {
      if (lane % kLanes == 0) h_scale[r * (inter / kGroup) + c / kGroup] = s;
    }
  }
}

}  // namespace finegemm::cuda
