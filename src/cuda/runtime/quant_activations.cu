// Host side of src/cuda/kernels/quant_activations.cuh: kernel choice, grids, launches.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda/kernels/quant_activations.cuh"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/quant_activations.hpp"

namespace finegemm::cuda {
namespace {

int num_sms() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int device = 0;
  FG_CUDA_CHECK(cudaGetDevice(&device));
  int sms = device < kMaxDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    FG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (device < kMaxDevices) cache[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// Blocks of kQuantThreads threads that fill the GPU once (the grid of the grid-stride kernels), never more than
// the work needs. Occupancy is a property of the kernel (one architecture is built), so it is asked once.
template <auto kKernel>
unsigned resident_grid(int64_t blocks_needed) {
  static const int blocks_per_sm = [] {
    int n = 0;
    FG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kQuantThreads, 0));
    return std::max(n, 1);
  }();
  const int64_t resident = int64_t{num_sms()} * blocks_per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks_needed, resident)));
}

// The group and static kernels index vectors with 32 bits: larger tensors go in slices of kMaxSliceVectors (a
// multiple of every group's vector count, so slices hold whole groups).
inline constexpr int64_t kMaxSliceVectors = int64_t{1} << 30;

// scale_ld > 0: M-major scales (one slice only: the caller checks num_vectors ≤ kMaxSliceVectors).
template <typename T, int kGroup, bool kPow2, bool kPermK>
void launch_group(const T* x, int64_t num_vectors, int64_t k, uint8_t* x_q, float* x_scale, int64_t scale_ld,
                  cudaStream_t stream) {
  constexpr auto kernel = quant_per_token_group_kernel<T, kGroup, kPow2, kPermK>;
  for (int64_t first = 0; first < num_vectors; first += kMaxSliceVectors) {
    const int n = static_cast<int>(std::min(num_vectors - first, kMaxSliceVectors));
    const unsigned grid = resident_grid<kernel>((n + 2 * kQuantThreads - 1) / (2 * kQuantThreads));
    kernel<<<grid, kQuantThreads, 0, stream>>>(x + first * 8, x_q + first * 8, x_scale + first / (kGroup / 8), n,
                                               static_cast<int>(k / kGroup), static_cast<int>(scale_ld));
  }
}

// The per-token kernel's shape: threads per row enough for kTokenVecs vectors each, a power of two up to a warp
// (rows share a block of kQuantThreads) or a multiple of 32 (a row per block); two_pass past what registers hold.
// K = 7168: 224 threads, 4 vectors each, 4096 blocks at M = 4096. FINEGEMM_PRINT_CONFIG=1 prints the choice.
struct TokenLaunch {
  bool two_pass = false;
  int threads_per_row = 0, threads = 0;
  unsigned grid = 0;
};
TokenLaunch choose_token_launch(int64_t m, int64_t k) {
  TokenLaunch c;
  const int64_t vecs = k / 8;
  if (vecs > int64_t{kTokenVecs} * kTokenMaxThreads) {
    c.two_pass = true;
    c.threads = c.threads_per_row = 512;
  } else {
    c.threads_per_row = static_cast<int>((vecs + kTokenVecs - 1) / kTokenVecs);
    if (c.threads_per_row <= 32) {
      int pow2 = 1;
      while (pow2 < c.threads_per_row) pow2 *= 2;
      c.threads_per_row = pow2;
      c.threads = kQuantThreads;
    } else {
      c.threads_per_row = (c.threads_per_row + 31) / 32 * 32;
      c.threads = c.threads_per_row;
    }
  }
  const int64_t rows_per_block = c.threads / c.threads_per_row;
  c.grid = static_cast<unsigned>((m + rows_per_block - 1) / rows_per_block);
  if (const char* print = std::getenv("FINEGEMM_PRINT_CONFIG"); print && *print == '1')
    std::fprintf(stderr, "finegemm: quantize per token M=%lld K=%lld -> %s threads_per_row=%d block=%d grid=%u\n",
                 static_cast<long long>(m), static_cast<long long>(k), c.two_pass ? "two-pass" : "one-pass",
                 c.threads_per_row, c.threads, c.grid);
  return c;
}

template <typename T, bool kPow2, bool kPermK>
void launch_token(const T* x, int64_t m, int64_t k, uint8_t* x_q, float* x_scale, cudaStream_t stream) {
  const TokenLaunch c = choose_token_launch(m, k);
  if (c.two_pass)
    quant_per_token_two_pass_kernel<T, kPow2, kPermK><<<c.grid, c.threads, 0, stream>>>(x, x_q, x_scale, static_cast<int>(k));
  else
    quant_per_token_kernel<T, kPow2, kPermK><<<c.grid, c.threads, 0, stream>>>(x, x_q, x_scale, m, static_cast<int>(k),
                                                                                c.threads_per_row);
}

// kPermK (permuted K for the FP4 decode kernel) takes groups of 128 only (launch_quantize_activations checks).
template <typename T, bool kPow2, bool kPermK>
void launch_group_size(const T* x, int64_t num_vectors, int64_t k, int group_size, uint8_t* x_q, float* x_scale,
                       int64_t scale_ld, cudaStream_t stream) {
  if constexpr (kPermK) {
    if (group_size == 128) return launch_group<T, 128, kPow2, true>(x, num_vectors, k, x_q, x_scale, scale_ld, stream);
    throw Error("activation.group_size: permuted K takes groups of 128, got " + std::to_string(group_size));
  }
  switch (group_size) {
    case 32: return launch_group<T, 32, kPow2, false>(x, num_vectors, k, x_q, x_scale, scale_ld, stream);
    case 64: return launch_group<T, 64, kPow2, false>(x, num_vectors, k, x_q, x_scale, scale_ld, stream);
    case 128: return launch_group<T, 128, kPow2, false>(x, num_vectors, k, x_q, x_scale, scale_ld, stream);
    default: throw Error("activation.group_size: expected 32, 64 or 128, got " + std::to_string(group_size));
  }
}

template <typename T, bool kPermK>
void launch_typed(const T* x, int64_t m, int64_t k, const ActivationRecipe& recipe, uint8_t* x_q, float* x_scale,
                  int64_t scale_ld, cudaStream_t stream) {
  const int64_t num_vectors = m * k / 8;
  if (num_vectors == 0) return;
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup:
      if (recipe.pow2_scale) launch_group_size<T, true, kPermK>(x, num_vectors, k, recipe.group_size, x_q, x_scale, scale_ld, stream);
      else launch_group_size<T, false, kPermK>(x, num_vectors, k, recipe.group_size, x_q, x_scale, scale_ld, stream);
      break;
    case ActGranularity::PerToken:
      if (recipe.pow2_scale) launch_token<T, true, kPermK>(x, m, k, x_q, x_scale, stream);
      else launch_token<T, false, kPermK>(x, m, k, x_q, x_scale, stream);
      break;
    case ActGranularity::StaticPerTensor: {
      constexpr auto kernel = quant_static_kernel<T, kPermK>;
      for (int64_t first = 0; first < num_vectors; first += kMaxSliceVectors) {
        const int n = static_cast<int>(std::min(num_vectors - first, kMaxSliceVectors));
        const unsigned grid = resident_grid<kernel>((n + 2 * kQuantThreads - 1) / (2 * kQuantThreads));
        kernel<<<grid, kQuantThreads, 0, stream>>>(x + first * 8, x_q + first * 8, x_scale, n);
      }
      break;
    }
  }
  FG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_typed(const T* x, int64_t m, int64_t k, const ActivationRecipe& recipe, uint8_t* x_q, float* x_scale,
                  int64_t scale_ld, bool perm_k, cudaStream_t stream) {
  if (perm_k) launch_typed<T, true>(x, m, k, recipe, x_q, x_scale, scale_ld, stream);
  else launch_typed<T, false>(x, m, k, recipe, x_q, x_scale, scale_ld, stream);
}

}  // namespace

bool quantize_perm_k_ok(const ActivationRecipe& recipe, int64_t k) {
  return k > 0 && k % 128 == 0 &&
         (recipe.granularity != ActGranularity::PerTokenGroup || recipe.group_size == 128);
}

void launch_quantize_activations(const void* x, DType x_dtype, int64_t m, int64_t k, const ActivationRecipe& recipe,
                                 uint8_t* x_q, float* x_scale, cudaStream_t stream, int64_t scale_ld, bool perm_k) {
  if (perm_k && (!quantize_perm_k_ok(recipe, k) || scale_ld != 0))
    throw Error("x_q: permuted K (the FP4 decode order) needs K % 128 == 0, groups of 128 and row-major scales, got K=" +
                std::to_string(k) + " scale_ld=" + std::to_string(scale_ld) + " for " + recipe.name());
  if (scale_ld != 0 &&
      (recipe.granularity != ActGranularity::PerTokenGroup || scale_ld < m || m * k / 8 > kMaxSliceVectors ||
       scale_ld * (k / std::max(1, recipe.group_size)) > INT32_MAX))
    throw Error("x_scale: M-major group scales need a per-token-group recipe, a leading dimension of at least M=" +
                std::to_string(m) + " and fewer than 2^31 scales, got scale_ld=" + std::to_string(scale_ld) +
                " for " + recipe.name());
  if (k % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(x_q) % 8 != 0)
    throw Error("x: the CUDA quantizer expects K % 8 == 0 and 16-byte aligned rows, got K=" + std::to_string(k));
  if (recipe.granularity == ActGranularity::PerTokenGroup && recipe.group_size > 0 && k % recipe.group_size != 0)
    throw Error("x: expected K divisible by the activation group size " + std::to_string(recipe.group_size) +
                ", got K=" + std::to_string(k));
  switch (x_dtype) {
    case DType::F32: return launch_typed(static_cast<const float*>(x), m, k, recipe, x_q, x_scale, scale_ld, perm_k, stream);
    case DType::BF16:
      return launch_typed(static_cast<const __nv_bfloat16*>(x), m, k, recipe, x_q, x_scale, scale_ld, perm_k, stream);
    case DType::F16: return launch_typed(static_cast<const __half*>(x), m, k, recipe, x_q, x_scale, scale_ld, perm_k, stream);
    default:
      throw Error(ErrorKind::Type, std::string("x: expected float32, bfloat16 or float16, got ") + dtype_name(x_dtype));
  }
}

}  // namespace finegemm::cuda
