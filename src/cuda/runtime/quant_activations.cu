#include "cuda/kernels/quant_activations.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/quant_activations.hpp"

namespace finegemm::cuda {
namespace {

template <typename T>
void launch_typed(const T* x, int64_t m, int64_t k, const ActivationRecipe& recipe, uint8_t* x_q, float* x_scale,
                  cudaStream_t stream) {
  const int64_t num_vectors = m * k / 8;
  if (num_vectors == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((num_vectors + kThreads - 1) / kThreads);
  constexpr int kVecs = 2;  // vectors per thread in the group kernel
  const auto group_blocks = static_cast<unsigned>((num_vectors + kThreads * kVecs - 1) / (kThreads * kVecs));
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup:
      if (recipe.group_size == 128)
        quant_per_token_group_kernel<T, 128, kVecs><<<group_blocks, kThreads, 0, stream>>>(x, x_q, x_scale, num_vectors,
                                                                                           recipe.pow2_scale);
      else if (recipe.group_size == 32)
        quant_per_token_group_kernel<T, 32, kVecs><<<group_blocks, kThreads, 0, stream>>>(x, x_q, x_scale, num_vectors,
                                                                                          recipe.pow2_scale);
      else
        throw Error("activation.group_size: expected 32 or 128, got " + std::to_string(recipe.group_size));
      break;
    case ActGranularity::PerToken: {
      const int threads = k >= 4096 ? 512 : 128;
      quant_per_token_kernel<T><<<static_cast<unsigned>(m), threads, 0, stream>>>(x, x_q, x_scale, static_cast<int>(k),
                                                                                  recipe.pow2_scale);
      break;
    }
    case ActGranularity::StaticPerTensor: {
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, 132 * 16));
      quant_static_kernel<T><<<grid, kThreads, 0, stream>>>(x, x_q, x_scale, num_vectors);
      break;
    }
  }
  FG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_quantize_activations(const void* x, DType x_dtype, int64_t m, int64_t k, const ActivationRecipe& recipe,
                                 uint8_t* x_q, float* x_scale, cudaStream_t stream) {
  if (k % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(x_q) % 8 != 0)
    throw Error("x: the CUDA quantizer expects K % 8 == 0 and 16-byte aligned rows, got K=" + std::to_string(k));
  switch (x_dtype) {
    case DType::F32: return launch_typed(static_cast<const float*>(x), m, k, recipe, x_q, x_scale, stream);
    case DType::BF16: return launch_typed(static_cast<const __nv_bfloat16*>(x), m, k, recipe, x_q, x_scale, stream);
    case DType::F16: return launch_typed(static_cast<const __half*>(x), m, k, recipe, x_q, x_scale, stream);
    default:
      throw Error(ErrorKind::Type, std::string("x: expected float32, bfloat16 or float16, got ") + dtype_name(x_dtype));
  }
}

}  // namespace finegemm::cuda
