// Op dispatch: validate, pick the backend from the options and the tensors' device, run.
#include <cstdlib>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "finegemm/error.hpp"
#include "finegemm/finegemm.hpp"
#if FINEGEMM_WITH_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace finegemm {
namespace {

// FINEGEMM_CPU_REF=1 switches the CPU fast path off (everything runs on the reference).
bool cpu_reference_forced() {
  const char* v = std::getenv("FINEGEMM_CPU_REF");
  return v && *v && std::string(v) != "0";
}

Backend resolve(Backend requested, Device device) {
  if (requested == Backend::Auto) requested = device.type == DeviceType::CUDA ? Backend::Cuda : Backend::Cpu;
  if (requested == Backend::Cpu && cpu_reference_forced()) requested = Backend::Reference;
  if (requested == Backend::Cuda) {
#if !FINEGEMM_WITH_CUDA
    throw Error(ErrorKind::Runtime, "backend: cuda requested, but this finegemm was built without CUDA");
#endif
    if (device.type != DeviceType::CUDA)
      throw Error("backend: cuda expects tensors on a CUDA device, got tensors on " + device_name(device));
  } else if (device.type != DeviceType::CPU) {
    throw Error(std::string("backend: ") + backend_name(requested) + " expects tensors on the CPU, got tensors on " +
                device_name(device));
  }
  return requested;
}

}  // namespace

void quantize_activations(const TensorView& x, const ActivationRecipe& recipe, const TensorView& x_q,
                          const TensorView& x_scale, const RunOptions& options) {
  validate_quantize_activations(x, recipe, x_q, x_scale);
  switch (resolve(options.backend, x.device)) {
#if FINEGEMM_WITH_CUDA
    case Backend::Cuda: return cuda::quantize_activations(x, recipe, x_q, x_scale, options.stream);
#endif
    default: return cpu::reference_quantize_activations(x, recipe, x_q, x_scale);
  }
}

void quantize_weights(const TensorView& w, const WeightRecipe& recipe, const TensorView& w_q, const TensorView& w_scale,
                      const RunOptions& options) {
  validate_quantize_weights(w, recipe, w_q, w_scale);
  if (w.device.type != DeviceType::CPU)
    throw Error("w: quantize_weights runs on the CPU (weights are quantized once, offline), got tensors on " +
                device_name(w.device));
  (void)options;
  cpu::reference_quantize_weights(w, recipe, w_q, w_scale);
}

void dequantize_weights(const TensorView& w_q, const TensorView& w_scale, const WeightRecipe& recipe,
                        const TensorView& w, const RunOptions& options) {
  if (w_q.device.type != DeviceType::CPU)
    throw Error("w_q: dequantize_weights runs on the CPU, got tensors on " + device_name(w_q.device));
  (void)options;
  cpu::reference_dequantize_weights(w_q, w_scale, recipe, w);
}

void linear(const LinearArgs& args, const RunOptions& options) {
  validate_linear(args);
  switch (resolve(options.backend, args.x.device)) {
    case Backend::Reference: return cpu::reference_linear(args);
#if FINEGEMM_WITH_CUDA
    case Backend::Cuda: return cuda::linear(args, options.stream, options.weights_static);
#endif
    default: return cpu::fast_linear(args);
  }
}

void moe_experts(const MoeArgs& args, const RunOptions& options) {
  validate_moe(args);
  switch (resolve(options.backend, args.hidden.device)) {
    case Backend::Reference: return cpu::reference_moe(args);
#if FINEGEMM_WITH_CUDA
    case Backend::Cuda: return cuda::moe_experts(args, options.stream, options.weights_constant);
#endif
    default: return cpu::fast_moe(args);
  }
}

}  // namespace finegemm
