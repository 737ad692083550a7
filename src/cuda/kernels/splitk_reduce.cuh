// Split-K finish for the dense GEMM: sums the partials in split order (deterministic), then the epilogue.
#pragma once
#include "cuda/kernels/sm90_fp8_gemm.cuh"

namespace finegemm::cuda {

// Split-K finish: out = Σ_split part[split] (in order: deterministic) · row · col scales + bias.
// Launched with programmatic stream serialization (p.pdl), it may start before the GEMM that writes the partials has
// finished: griddepcontrol.wait (a no-op otherwise) holds it until then.
__global__ void splitk_reduce_kernel(const GemmParams p, int split_k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
  if (p.gate != nullptr && (*p.gate & p.gate_mask) != p.gate_value) return;  // its GEMM was the idle one of a gated pair
  const int64_t pairs = static_cast<int64_t>(p.m) * p.n / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i * 2;
    const int row = static_cast<int>(e / p.n), col = static_cast<int>(e % p.n);
    float v0 = 0.0f, v1 = 0.0f;
    for (int s = 0; s < split_k; ++s) {
      const float2 v = *reinterpret_cast<const float2*>(p.workspace + static_cast<int64_t>(s) * p.m * p.n + e);
      v0 += v.x;
      v1 += v.y;
    }
    const float rs = load_vec(p.row_mode, p.row_scale, row);
    store_pair(p, row, col, splitk_finish(v0, rs, load_vec(p.col_mode, p.col_scale, col), load_bias(p, col)),
               splitk_finish(v1, rs, load_vec(p.col_mode, p.col_scale, col + 1), load_bias(p, col + 1)));
  }
}

}  // namespace finegemm::cuda
