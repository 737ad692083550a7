// MoE combine: out[t] = Σ_j y[slot_row[t, j]] over the token's slots in slot order, accumulated in fp32: a gather,
// one thread per 8 output elements, so the sum has one fixed order (deterministic, no atomics).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/quant_activations.cuh"

namespace finegemm::cuda {

inline constexpr int kCombineMaxThreads = 256;

__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// grid: (T, ceil(H/8 / blockDim)); y [T·k, H], out [T, H].
template <typename y_t, typename out_t>
__global__ void __launch_bounds__(kCombineMaxThreads)
    moe_combine_kernel(const y_t* __restrict__ y, const int* __restrict__ slot_row, int top_k, int hidden_size,
                       out_t* __restrict__ out) {
  wait_for_prior_grids();  // a programmatic launch (the decode path) waits for down
  allow_dependent_launch();
  const int64_t token = blockIdx.x;
  const int vec = blockIdx.y * blockDim.x + threadIdx.x;
  if (vec >= hidden_size / 8) return;
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
  for (int j = 0; j < top_k; ++j) {
    const int row = slot_row[token * top_k + j];
    if (row < 0) continue;
    Vec8<y_t> in;
    in.load(y + static_cast<int64_t>(row) * hidden_size + vec * 8);
    float v[8];
    in.to_float(v);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += v[i];
  }
  store8(out + token * hidden_size + vec * 8, acc);
}

}  // namespace finegemm::cuda
