// MoE permutation fused with activation quantization: one block per token reads the token's row once (16-byte
// loads, kept in registers), quantizes it per the recipe with the same arithmetic as quant_activations.cuh (so the
// codes and scales match the CPU reference bit for bit), and writes it to each permuted row the token routes to.
#pragma once
#include <cstdint>

#include "cuda/kernels/quant_activations.cuh"

namespace finegemm::cuda {

enum class PermuteQuant { Group32, Group128, Token, Static };

template <PermuteQuant kQuant>
inline constexpr int kPermuteGroupLanes = kQuant == PermuteQuant::Group32 ? 4 : kQuant == PermuteQuant::Group128 ? 16 : 0;

// hidden [T, H]; thread `tid` owns the vectors (8 elements) tid, tid + blockDim, ... (kVecs of them at most).
// blockDim is a multiple of 32, so a group of kLanes vectors sits in kLanes consecutive lanes of one warp.
// kPermK: the codes in the FP4 decode kernel's K order within each 128 of H (store_codes; H % 128 == 0).
template <typename T, int kVecs, PermuteQuant kQuant, bool kPermK = false>
__global__ void moe_permute_quantize_kernel(const T* __restrict__ hidden, int hidden_size, int top_k,
                                            const int* __restrict__ slot_row, const int* __restrict__ row_expert,
                                            const float* __restrict__ static_scales, bool pow2,
                                            uint8_t* __restrict__ x_q, float* __restrict__ x_scale) {
  static_assert(kVecs >= 1 && kVecs <= 8, "kVecs: 1 to 8 vectors of 8 elements per thread");
  wait_for_prior_grids();  // a programmatic launch (the decode path) waits for the routing
  allow_dependent_launch();
  const int64_t token = blockIdx.x;
  const int num_vectors = hidden_size / 8;

  // Read the token's row once; vectors past the row's end are zeros (they never reach memory)
  float v[kVecs][8];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    const int vec = u * blockDim.x + threadIdx.x;
    if (vec < num_vectors) {
      Vec8<T> in;
      in.load(hidden + token * hidden_size + vec * 8);
      in.to_float(v[u]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[u][i] = 0.0f;
    }
  }

  // Dynamic scales (the static recipe quantizes per destination below)
  float scale[kVecs];
  if constexpr (kQuant == PermuteQuant::Group32 || kQuant == PermuteQuant::Group128) {
    constexpr int kLanes = kPermuteGroupLanes<kQuant>;
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[u][i]));
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset /= 2)
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
      scale[u] = fmaxf(amax, kMinAmax) / kE4M3MaxF;
      if (pow2) scale[u] = pow2_ceil_device(scale[u]);
    }
  } else if constexpr (kQuant == PermuteQuant::Token) {
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < kVecs; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[u][i]));
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    __shared__ float warp_max[32];
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
    float s = fmaxf(amax, kMinAmax) / kE4M3MaxF;
    if (pow2) s = pow2_ceil_device(s);
#pragma unroll
    for (int u = 0; u < kVecs; ++u) scale[u] = s;
  }

  // Dynamic codes are the same for every destination: quantize once
  uint2 codes[kVecs];
  if constexpr (kQuant != PermuteQuant::Static) {
#pragma unroll
    for (int u = 0; u < kVecs; ++u) codes[u] = quantize8(v[u], scale[u]);
  }

  // Write the row (and its scales) to each permuted row of the token; the loop is uniform across the block
  for (int j = 0; j < top_k; ++j) {
    const int row = slot_row[token * top_k + j];
    if (row < 0) continue;
    uint8_t* out = x_q + static_cast<int64_t>(row) * hidden_size;
    if constexpr (kQuant == PermuteQuant::Static) {
      const float s = static_scales[row_expert[row]];
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int vec = u * blockDim.x + threadIdx.x;
        if (vec < num_vectors) store_codes<kPermK>(out, vec, quantize8(v[u], s));
      }
    } else {
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const int vec = u * blockDim.x + threadIdx.x;
        if (vec < num_vectors) store_codes<kPermK>(out, vec, codes[u]);
      }
      if constexpr (kQuant == PermuteQuant::Token) {
        if (threadIdx.x == 0) x_scale[row] = scale[0];
      } else {
        constexpr int kLanes = kPermuteGroupLanes<kQuant>;
        const int groups_per_row = num_vectors / kLanes;
#pragma unroll
        for (int u = 0; u < kVecs; ++u) {
          const int vec = u * blockDim.x + threadIdx.x;
          if (vec < num_vectors && threadIdx.x % kLanes == 0)
            x_scale[static_cast<int64_t>(row) * groups_per_row + vec / kLanes] = scale[u];
        }
      }
    }
  }
}

}  // namespace finegemm::cuda
