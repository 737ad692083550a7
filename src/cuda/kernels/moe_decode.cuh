// The MoE block at decode sizes (moe_decode.cu): the experts' GEMMs run on the decode kernel (sm90_fp4_decode.cuh)
// over the experts that have rows, listed here on the device; between gate_up and down, one block per row applies
// the activation and quantizes the intermediate (per group, per row or with the expert's static scale).
// NOTE: plain __global__ functions in a header: included by moe_decode.cu only (a second includer would define them
// twice).
#pragma once
#include <cstdint>

#include "cuda/kernels/moe_activation.cuh"
#include "cuda/kernels/quant_activations.cuh"

namespace finegemm::cuda {

inline constexpr int kActiveExpertThreads = 1024;
inline constexpr int kActQuantThreads = 256;

// list[0..count) = the experts e with offsets[e + 1] > offsets[e], ascending; one block.
__global__ void __launch_bounds__(kActiveExpertThreads)
    moe_active_experts_kernel(const int32_t* __restrict__ offsets, int num_experts, int32_t* __restrict__ list,
                              int32_t* __restrict__ count) {
  wait_for_prior_grids();    // a programmatic launch waits for the routing's offsets
  allow_dependent_launch();  // gate_up under FINEGEMM_PDL=1 waits for this kernel before it reads the list
  __shared__ int warp_counts[kActiveExpertThreads / 32];
  __shared__ int base;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int e0 = 0; e0 < num_experts; e0 += kActiveExpertThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    const bool active = e < num_experts && offsets[e + 1] > offsets[e];
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, active);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = base;
    for (int w = 0; w < warp; ++w) before += warp_counts[w];
    if (active) list[before + __popc(ballot & ((1u << lane) - 1u))] = e;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 0; w < kActiveExpertThreads / 32; ++w) base += warp_counts[w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = base;
}

// The expert of permuted row r: the e with offsets[e] ≤ r < offsets[e + 1] (the number of offsets[1..E] ≤ r).
__device__ __forceinline__ int moe_expert_of_row(const int32_t* offsets, int num_experts, int r) {
  int lo = 0, hi = num_experts;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= r) lo = mid;
    else hi = mid;
  }
  return lo;
}

// One row r < offsets[E] of the gate_up output y [rows, ld] (F32, scales and bias applied) per block:
// h = act(gate, up) (moe_activation_kernel's columns), then E4M3 codes h_q [r, I] with
//   group > 0: a dynamic scale per group of `group` columns (32 or 128), h_scale [r, I / group];
//   group == 0, static_scales null: one dynamic scale per row, h_scale [r];
//   static_scales: the row's expert's static scale (nothing written to h_scale).
// The scales and codes are those of quantize_row in the CPU reference (dynamic_scale, quantize8).
// Each thread takes vectors of 8 columns, vector v of the row at threads v % kActQuantThreads; a group's vectors
// (group / 8 of them, a power of two ≤ 16) are consecutive lanes of one warp.
__device__ __forceinline__ void moe_act8(const float* row, int64_t inter, MoeGateLayout layout, int act_kind,
                                         float limit, float alpha, int64_t i0, float (&v)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t i = i0 + j;
    switch (layout) {
      case MoeGateLayout::Halves: v[j] = moe_gated_act(act_kind, limit, alpha, row[i], row[inter + i]); break;
      case MoeGateLayout::Interleaved: v[j] = moe_gated_act(act_kind, limit, alpha, row[2 * i], row[2 * i + 1]); break;
      case MoeGateLayout::NoGate: v[j] = moe_plain_act(act_kind, row[i]); break;
    }
  }
}

// kPermK: h_q in the FP4 decode kernel's K order within each 128 of I (store_codes; I % 128 == 0).
template <bool kPermK>
__global__ void __launch_bounds__(kActQuantThreads)
    moe_act_quant_rows_kernel(const float* __restrict__ y, int64_t ld, int64_t inter, MoeGateLayout layout,
                              int act_kind, float limit, float alpha, const int32_t* __restrict__ offsets,
                              int num_experts, int group, bool pow2, const float* __restrict__ static_scales,
                              uint8_t* __restrict__ h_q, float* __restrict__ h_scale) {
  wait_for_prior_grids();    // a programmatic launch waits for gate_up
  allow_dependent_launch();  // down under FINEGEMM_PDL=1 streams its first weights meanwhile, then waits for this kernel
  const int r = static_cast<int>(blockIdx.x);
  if (r >= offsets[num_experts]) return;  // the whole block: rows past the routed ones are never read
  const float* row = y + static_cast<int64_t>(r) * ld;
  uint8_t* q = h_q + static_cast<int64_t>(r) * inter;
  const int vecs = static_cast<int>(inter / 8);
  // Every lane of a warp runs each round (vectors past the row count as zeros), so that the shuffles are whole.
  const int rounds = (vecs + kActQuantThreads - 1) / kActQuantThreads;
  if (group > 0) {
    const int lanes = group / 8;
    for (int k = 0; k < rounds; ++k) {
      const int v = k * kActQuantThreads + static_cast<int>(threadIdx.x);
      float x[8] = {};
      if (v < vecs) moe_act8(row, inter, layout, act_kind, limit, alpha, static_cast<int64_t>(v) * 8, x);
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
      for (int o = lanes / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
      if (v < vecs) {
        const float s = dynamic_scale(amax, pow2);
        store_codes<kPermK>(q, v, quantize8(x, s));
        if (v % lanes == 0) h_scale[static_cast<int64_t>(r) * (inter / group) + v / lanes] = s;
      }
    }
    return;
  }
  float s;
  if (static_scales) {
    s = static_scales[moe_expert_of_row(offsets, num_experts, r)];
  } else {
    // The row's amax: the activation computed once here and again below (the row is in L1/L2 by then).
    __shared__ float warp_max[kActQuantThreads / 32];
    float amax = 0.0f;
    for (int v = threadIdx.x; v < vecs; v += kActQuantThreads) {
      float x[8];
      moe_act8(row, inter, layout, act_kind, limit, alpha, static_cast<int64_t>(v) * 8, x);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(x[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = warp_max[0];
#pragma unroll
    for (int w = 1; w < kActQuantThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    s = dynamic_scale(amax, pow2);
    if (threadIdx.x == 0) h_scale[r] = s;
  }
  for (int v = threadIdx.x; v < vecs; v += kActQuantThreads) {
    float x[8];
    moe_act8(row, inter, layout, act_kind, limit, alpha, static_cast<int64_t>(v) * 8, x);
    store_codes<kPermK>(q, v, quantize8(x, s));
  }
}

}  // namespace finegemm::cuda
