// Host side of src/cuda/kernels/quant_activations.cuh.
#pragma once
#include <cuda_runtime.h>

#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm::cuda {

// x [M, K] F32/BF16/F16 (contiguous, K % 8 == 0, 16-byte aligned) → x_q [M, K] E4M3 and scales:
// group: x_scale [M, K/group] written; token: [M] written; static: x_scale (device scalar) read.
// scale_ld > 0 (groups only, at least M): the group scales M-major instead, scale (row, g) at g · scale_ld + row (the
// layout of GemmParams::a_scale_bulk).
void launch_quantize_activations(const void* x, DType x_dtype, int64_t m, int64_t k, const ActivationRecipe& recipe,
                                 uint8_t* x_q, float* x_scale, cudaStream_t stream, int64_t scale_ld = 0);

}  // namespace finegemm::cuda
