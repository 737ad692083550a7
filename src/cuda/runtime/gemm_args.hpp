// From recipes and tensors to GemmParams: the one place that maps a recipe pair onto the GEMM's scale fields.
// Used by linear (src/cuda/runtime/linear.cu), the MoE block (moe.cu) and the MoE benchmark.
#pragma once
#include <cuda_runtime.h>

#include <numeric>
#include <string>

#include "cuda/kernels/gemm_params.cuh"
#include "cuda/runtime/check.hpp"
#include "finegemm/error.hpp"
#include "finegemm/recipe.hpp"
#include "finegemm/tensor.hpp"

namespace finegemm::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline OutDType out_dtype_of(DType d) {
  switch (d) {
    case DType::F32: return OutDType::F32;
    case DType::BF16: return OutDType::BF16;
    case DType::F16: return OutDType::F16;
    default: throw Error(ErrorKind::Type, std::string("out: expected bfloat16, float16 or float32, got ") + dtype_name(d));
  }
}

inline ScaleFmt scale_fmt_of(ScaleFormat f) {
  return f == ScaleFormat::FP32 ? ScaleFmt::F32 : (f == ScaleFormat::UE8M0 ? ScaleFmt::UE8M0 : ScaleFmt::UE8M0_PACKED);
}

// finegemm's scratch pool of the current device (memory.cu): keeps what was freed.
void* scratch_alloc(size_t bytes, cudaStream_t stream);
// The same, or nullptr when the device is out of memory (optional scratch: the caller takes a path without it).
void* scratch_try_alloc(size_t bytes, cudaStream_t stream);
cudaMemPool_t scratch_pool(int device);   // created on first use
bool scratch_pool_created(int device);

// Stream-ordered scratch, freed on the stream (capturable in CUDA graphs).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) { ptr_ = scratch_alloc(bytes ? bytes : 16, stream); }
  ~StreamScratch() { (void)cudaFreeAsync(ptr_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// The promotion granularity a recipe pair needs: the largest slice of a 128-wide K block inside which every scale
// is constant. 0 when no scale varies along K (everything folds into the epilogue).
inline int promotion_k(const WeightRecipe& w, const ActivationRecipe& a) {
  int g = a.granularity == ActGranularity::PerTokenGroup ? std::gcd(128, a.group_size) : 0;
  if (w.granularity == WeightGranularity::Block || w.granularity == WeightGranularity::MX)
    g = std::gcd(g == 0 ? 128 : g, w.granularity == WeightGranularity::MX ? 32 : w.block_k);
  return g;
}

// Activation side: x_scale per the recipe (group: [rows, K/group] with the given strides; token: [rows]);
// static: the scale of group (expert) g is static_scales[g] (a dense linear has one group).
inline void set_activation_scales(GemmParams& p, const ActivationRecipe& recipe, const float* x_scale,
                                  int64_t stride_m, int64_t stride_k, int64_t k, const float* static_scales) {
  switch (recipe.granularity) {
    case ActGranularity::PerTokenGroup:
      p.a_scale = x_scale;
      p.a_scale_stride_m = stride_m;
      p.a_scale_stride_k = stride_k;
      p.a_group = recipe.group_size;
      p.a_scale_cols = static_cast<int>(k / recipe.group_size);
      break;
    case ActGranularity::PerToken:
      p.row_mode = VecMode::PerIndex;
      p.row_scale = x_scale;
      break;
    case ActGranularity::StaticPerTensor:
      p.row_mode = VecMode::Scalar;
      p.row_scale = static_scales;
      p.row_scale_group_stride = 1;
      break;
  }
}

// Weight side: scale is [(E,) <weight_scale_shape(n, k)>] per the recipe; per-group strides follow from its shape.
inline void set_weight_scales(GemmParams& p, const WeightRecipe& recipe, const TensorView& scale, int64_t n, int64_t k) {
  switch (recipe.granularity) {
    case WeightGranularity::PerTensor:
      p.col_mode = VecMode::Scalar;
      p.col_scale = scale.ptr<float>();
      p.col_group_stride = 1;
      break;
    case WeightGranularity::PerChannel:
      p.col_mode = VecMode::PerIndex;
      p.col_scale = scale.ptr<float>();
      p.col_group_stride = n;
      break;
    case WeightGranularity::Block:
    case WeightGranularity::MX: {
      const auto shape = weight_scale_shape(recipe, n, k);
      p.b_scale = scale.data;
      p.b_scale_fmt = scale_fmt_of(recipe.scale_format);
      p.b_scale_stride_n = shape[1];
      p.b_scale_group_stride = shape[0] * shape[1];
      p.b_block_n = recipe.granularity == WeightGranularity::MX ? 1 : recipe.block_n;
      p.b_block_k = recipe.granularity == WeightGranularity::MX ? 32 : recipe.block_k;
      p.b_scale_cols = static_cast<int>(recipe.scale_cols(k));
      break;
    }
  }
}

// Bias [(E,) rows] and its per-group stride.
inline void set_bias(GemmParams& p, const TensorView& bias, int64_t rows_per_group) {
  if (!bias.defined()) return;
  p.bias = bias.data;
  p.bias_dtype = static_cast<int>(out_dtype_of(bias.dtype));
  p.bias_group_stride = rows_per_group;
}

}  // namespace finegemm::cuda
