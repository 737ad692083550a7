#include <vector>

#include "cpu/cpu_backend.hpp"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/host_fallback.hpp"

namespace finegemm::cuda {
namespace {

// A host copy of a device tensor: the memory its strides span (the numel of a contiguous one; an M-major x_scale
// spans ld · (G - 1) + M elements), with the same strides.
struct HostCopy {
  std::vector<uint8_t> bytes;
  TensorView view;
};

HostCopy to_host(const TensorView& t, cudaStream_t stream) {
  HostCopy h;
  if (!t.defined()) return h;
  int64_t span = t.numel() > 0 ? 1 : 0;
  if (span && !t.is_contiguous())
    for (int d = 0; d < t.ndim; ++d) span += (t.shape[d] - 1) * t.strides[d];
  else span = t.numel();
  const size_t n = static_cast<size_t>(span) * dtype_size(t.dtype);
  h.bytes.resize(n + 1);
  if (n) FG_CUDA_CHECK(cudaMemcpyAsync(h.bytes.data(), t.data, n, cudaMemcpyDeviceToHost, stream));
  h.view = t;
  h.view.data = h.bytes.data();
  h.view.device = Device{};
  return h;
}

void back_to_device(const HostCopy& h, const TensorView& t, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
  if (n) FG_CUDA_CHECK(cudaMemcpyAsync(t.data, h.bytes.data(), n, cudaMemcpyHostToDevice, stream));
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

void linear_on_host(const LinearArgs& args, cudaStream_t stream) {
  HostCopy x = to_host(args.x, stream), xs = to_host(args.x_scale, stream), w = to_host(args.weight, stream),
           ws = to_host(args.weight_scale, stream), bias = to_host(args.bias, stream), out = to_host(args.out, stream);
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  LinearArgs host = args;
  host.x = x.view;
  host.x_scale = xs.view;
  host.weight = w.view;
  host.weight_scale = ws.view;
  host.bias = bias.view;
  host.out = out.view;
  cpu::fast_linear(host);
  back_to_device(out, args.out, stream);
}

void moe_on_host(const MoeArgs& args, cudaStream_t stream) {
  const TensorView* inputs[] = {&args.hidden, &args.top_k_index, &args.top_k_weights, &args.gate_up,
                                &args.gate_up_scale, &args.down, &args.down_scale, &args.gate_up_act_scale,
                                &args.down_act_scale, &args.gate_up_bias, &args.down_bias, &args.out};
  std::vector<HostCopy> copies;
  copies.reserve(std::size(inputs));
  for (const TensorView* t : inputs) copies.push_back(to_host(*t, stream));
  FG_CUDA_CHECK(cudaStreamSynchronize(stream));
  MoeArgs host = args;
  TensorView* fields[] = {&host.hidden, &host.top_k_index, &host.top_k_weights, &host.gate_up,
                          &host.gate_up_scale, &host.down, &host.down_scale, &host.gate_up_act_scale,
                          &host.down_act_scale, &host.gate_up_bias, &host.down_bias, &host.out};
  for (size_t i = 0; i < copies.size(); ++i) *fields[i] = copies[i].view;
  cpu::fast_moe(host);
  back_to_device(copies.back(), args.out, stream);
}

}  // namespace finegemm::cuda
