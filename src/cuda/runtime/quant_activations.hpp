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
// perm_k: x_q in the FP4 decode kernel's K order (each 128 of K permuted, fp4_perm_vector_offset; GemmParams::a_perm_k),
// where quantize_perm_k_ok(recipe, k): K % 128 == 0 and, for group scales, groups of 128 (row-major scales).
void launch_quantize_activations(const void* x, DType x_dtype, int64_t m, int64_t k, const ActivationRecipe& recipe,
                                 uint8_t* x_q, float* x_scale, cudaStream_t stream, int64_t scale_ld = 0,
                                 bool perm_k = false);
bool quantize_perm_k_ok(const ActivationRecipe& recipe, int64_t k);

}  // namespace finegemm::cuda
