// CUDA entry points: quantize_activations, linear, moe_experts. Arguments arrive validated.
#include <optional>

#include "cuda/cuda_backend.hpp"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/host_fallback.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm::cuda {

void quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                          const TensorView& x_scale, void* stream) {
  const DeviceGuard guard(x.device.index);
  launch_quantize_activations(x.data, x.dtype, x.shape[0], x.shape[1], recipe, x_q.ptr<uint8_t>(), x_scale.ptr<float>(),
                              static_cast<cudaStream_t>(stream));
}

void linear(const LinearArgs& args, void* stream_handle, bool weights_static) {
  const DeviceGuard guard(args.x.device.index);
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const int64_t m = args.x.shape[0], k = args.x.shape[1], n = args.weight.shape[0];
  const int promote_k = promotion_k(args.weight_recipe, args.activation);
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

  // The weight side first: whether the activations go in the FP4 decode kernel's permuted order depends on it.
  set_weight_scales(p, args.weight_recipe, args.weight_scale, n, k);
  if (args.activation.granularity == ActGranularity::PerTokenGroup) p.a_group = args.activation.group_size;
  const bool perm_k = args.x.dtype != DType::F8_E4M3 && quantize_perm_k_ok(args.activation, k) &&
                      fp4_decode_perm_wanted(p);

  // Activations: quantize on the fly unless they arrive as E4M3.
  const void* x_q = args.x.data;
  const float* x_scale = args.x_scale.defined() ? args.x_scale.ptr<float>() : nullptr;
  int64_t scale_stride_m = args.x_scale.defined() && args.x_scale.ndim >= 1 ? args.x_scale.strides[0] : 0;
  int64_t scale_stride_k = args.x_scale.defined() && args.x_scale.ndim >= 2 ? args.x_scale.strides[1] : 0;
  std::optional<StreamScratch> q_buffer, s_buffer;
  bool own_m_major = false;  // the scales in our own M-major buffer, padding rows included
  if (args.x.dtype != DType::F8_E4M3) {
    q_buffer.emplace(static_cast<size_t>(m * k), stream);
    x_q = q_buffer->as<void>();
    // Groups of 128 are written M-major ([K/128, M rounded up to 4], the padding rows set) for the GEMM's bulk scale
    // copies (GemmParams::a_scale_bulk; prefill sizes, E4M3 weights promoted every 128, or FP4 weights, whose
    // promote_k is 32, for the lean kernel that expands them, FINEGEMM_FP4_LEAN; FINEGEMM_GEMM_SCALE_BULK=0:
    // row-major).
    const int64_t m_major_ld = (m + 3) / 4 * 4;
    const bool m_major = !args.activation.is_static() && args.activation.granularity == ActGranularity::PerTokenGroup &&
                         args.activation.group_size == 128 &&
                         (fp4 ? fp4_lean_block_m(false, 0) != 0 : promote_k == 128) && m > 64 &&
                         m * k / 8 <= (int64_t{1} << 30) && a_scale_bulk_wanted();
    if (m_major) {
      own_m_major = true;
      s_buffer.emplace(sizeof(float) * static_cast<size_t>(m_major_ld * (k / 128)), stream);
      x_scale = s_buffer->as<float>();
      scale_stride_m = 1;
      scale_stride_k = m_major_ld;
    } else if (!args.activation.is_static()) {
      const auto shape = activation_scale_shape(args.activation, m, k);
      s_buffer.emplace(sizeof(float) * static_cast<size_t>(shape.size() == 2 ? shape[0] * shape[1] : shape[0]), stream);
      x_scale = s_buffer->as<float>();
      scale_stride_m = shape.size() == 2 ? shape[1] : 1;
      scale_stride_k = 1;
    }
    launch_quantize_activations(args.x.data, args.x.dtype, m, k, args.activation, static_cast<uint8_t*>(const_cast<void*>(x_q)),
                                const_cast<float*>(x_scale), stream, m_major ? m_major_ld : 0, perm_k);
    p.a_perm_k = perm_k;
    // The kernel ahead of the GEMM is now the quantization: a programmatic decode launch may request weights before
    // it waits (GemmParams::pdl_weights_ready).
    p.pdl_weights_ready = true;
  }
  // The caller promises that the kernel ahead does not write the weights (RunOptions::weights_static).
  if (weights_static) p.pdl_weights_ready = true;
  set_activation_scales(p, args.activation, x_scale, scale_stride_m, scale_stride_k, k, x_scale);
  // Our own M-major buffer holds its padding rows (a caller's M-major x_scale may end at row M).
  p.a_scale_padded = own_m_major;

  // Epilogue.
  set_bias(p, args.bias, n);
  p.out = args.out.data;
  p.out_dtype = out_dtype_of(args.out.dtype);
  p.ldo = args.out.strides[0];

  launch_sm90_fp8_gemm(x_q, k, args.weight.data, args.weight.strides[0], p, stream);
}


}  // namespace finegemm::cuda
