// CUDA entry points: quantize_activations, linear, moe_experts. Arguments arrive validated.
#include <numeric>
#include <optional>

#include "cuda/cuda_backend.hpp"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/host_fallback.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

OutDType out_dtype_of(DType d) {
  switch (d) {
    case DType::F32: return OutDType::F32;
    case DType::BF16: return OutDType::BF16;
    case DType::F16: return OutDType::F16;
    default: throw Error(ErrorKind::Type, std::string("out: expected bfloat16, float16 or float32, got ") + dtype_name(d));
  }
}

// Stream-ordered scratch, freed on the stream (capturable in CUDA graphs).
struct StreamScratch {
  void* ptr = nullptr;
  cudaStream_t stream = nullptr;
  StreamScratch(size_t bytes, cudaStream_t s) : stream(s) { FG_CUDA_CHECK(cudaMallocAsync(&ptr, bytes ? bytes : 16, s)); }
  ~StreamScratch() { (void)cudaFreeAsync(ptr, stream); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
};

// The promotion granularity a recipe pair needs: the largest slice of a 128-wide K block inside which every scale
// is constant. 0 when no scale varies along K (everything folds into the epilogue).
int promotion_k(const LinearArgs& args) {
  int g = 0;
  if (args.activation.granularity == ActGranularity::PerTokenGroup) g = std::gcd(128, args.activation.group_size);
  const auto& w = args.weight_recipe;
  if (w.granularity == WeightGranularity::Block || w.granularity == WeightGranularity::MX) {
    const int bk = w.granularity == WeightGranularity::MX ? 32 : w.block_k;
    g = std::gcd(g == 0 ? 128 : g, bk);
  }
  return g;
}

}  // namespace

void quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                          const TensorView& x_scale, void* stream) {
  const DeviceGuard guard(x.device.index);
  launch_quantize_activations(x.data, x.dtype, x.shape[0], x.shape[1], recipe, x_q.ptr<uint8_t>(), x_scale.ptr<float>(),
                              static_cast<cudaStream_t>(stream));
}

void linear(const LinearArgs& args, void* stream_handle) {
  const DeviceGuard guard(args.x.device.index);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const int64_t m = args.x.shape[0], k = args.x.shape[1], n = args.weight.shape[0];
  const int promote_k = promotion_k(args);
  // What the sm_90a kernel serves: FP8 weights (FP4 is its own issue), 16-byte aligned K-major rows, even N,
  // and K-granular scales in slices of 32, 64 or 128.
  // FP4 weights (packed two per byte, MX 1x32 scales) are expanded to E4M3 in shared memory by the same kernel.
  const bool fp4 = args.weight_recipe.element == ElementType::FP4_E2M1;
  // NOTE: out is stored two elements at a time; K = 0 has no K block for a tensor map (the host path writes bias).
  const bool out_aligned = reinterpret_cast<uintptr_t>(args.out.data) % (2 * dtype_size(args.out.dtype)) == 0;
  const bool gpu_kernel = k > 0 && out_aligned && k % (fp4 ? 32 : 16) == 0 && n % 2 == 0 && aligned16(args.x.data) &&
                          aligned16(args.weight.data) && (promote_k == 0 || promote_k % 32 == 0) &&
                          (!fp4 || (promote_k == 32 && args.weight_recipe.granularity == WeightGranularity::MX)) &&
                          m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX;
  if (!gpu_kernel) return linear_on_host(args, stream);
  if (m == 0 || n == 0) return;

  GemmParams p;
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.promote_k = promote_k == 0 ? 128 : promote_k;
  p.b_fp4 = fp4;

  // Activations: quantize on the fly unless they arrive as E4M3.
  const void* x_q = args.x.data;
  const float* x_scale = args.x_scale.defined() ? args.x_scale.ptr<float>() : nullptr;
  int64_t scale_stride_m = args.x_scale.defined() && args.x_scale.ndim >= 1 ? args.x_scale.strides[0] : 0;
  int64_t scale_stride_k = args.x_scale.defined() && args.x_scale.ndim >= 2 ? args.x_scale.strides[1] : 0;
  std::optional<StreamScratch> q_buffer, s_buffer;
  if (args.x.dtype != DType::F8_E4M3) {
    q_buffer.emplace(static_cast<size_t>(m * k), stream);
    x_q = q_buffer->ptr;
    if (!args.activation.is_static()) {
      const auto shape = activation_scale_shape(args.activation, m, k);
      s_buffer.emplace(sizeof(float) * static_cast<size_t>(shape.size() == 2 ? shape[0] * shape[1] : shape[0]), stream);
      x_scale = static_cast<float*>(s_buffer->ptr);
      scale_stride_m = shape.size() == 2 ? shape[1] : 1;
      scale_stride_k = 1;
    }
    launch_quantize_activations(args.x.data, args.x.dtype, m, k, args.activation, static_cast<uint8_t*>(const_cast<void*>(x_q)),
                                const_cast<float*>(x_scale), stream);
  }
  switch (args.activation.granularity) {
    case ActGranularity::PerTokenGroup:
      p.a_scale = x_scale;
      p.a_scale_stride_m = scale_stride_m;
      p.a_scale_stride_k = scale_stride_k;
      p.a_group = args.activation.group_size;
      p.a_scale_cols = static_cast<int>(k / args.activation.group_size);
      break;
    case ActGranularity::PerToken:
      p.row_mode = VecMode::PerIndex;
      p.row_scale = x_scale;
      break;
    case ActGranularity::StaticPerTensor:
      p.row_mode = VecMode::Scalar;
      p.row_scale = x_scale;
      break;
  }

  // Weights.
  const auto& w = args.weight_recipe;
  switch (w.granularity) {
    case WeightGranularity::PerTensor:
      p.col_mode = VecMode::Scalar;
      p.col_scale = args.weight_scale.ptr<float>();
      break;
    case WeightGranularity::PerChannel:
      p.col_mode = VecMode::PerIndex;
      p.col_scale = args.weight_scale.ptr<float>();
      break;
    case WeightGranularity::Block:
    case WeightGranularity::MX:
      p.b_scale = args.weight_scale.data;
      p.b_scale_fmt = w.scale_format == ScaleFormat::FP32    ? ScaleFmt::F32
                      : w.scale_format == ScaleFormat::UE8M0 ? ScaleFmt::UE8M0
                                                             : ScaleFmt::UE8M0_PACKED;
      p.b_scale_stride_n = args.weight_scale.strides[0];
      p.b_block_n = w.granularity == WeightGranularity::MX ? 1 : w.block_n;
      p.b_block_k = w.granularity == WeightGranularity::MX ? 32 : w.block_k;
      p.b_scale_cols = static_cast<int>(w.scale_cols(k));
      break;
  }

  // Epilogue.
  if (args.bias.defined()) {
    p.bias = args.bias.data;
    p.bias_dtype = static_cast<int>(out_dtype_of(args.bias.dtype));
  }
  p.out = args.out.data;
  p.out_dtype = out_dtype_of(args.out.dtype);
  p.ldo = args.out.strides[0];

  launch_sm90_fp8_gemm(x_q, k, args.weight.data, args.weight.strides[0], p, stream);
}


}  // namespace finegemm::cuda
