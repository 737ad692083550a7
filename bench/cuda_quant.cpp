// Activation quantization bandwidth (bf16 → E4M3) against the device-to-device copy ceiling, same run.
// Bytes counted: input read + E4M3 written + scales written (copy: bytes read + written).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "finegemm/finegemm.hpp"

using namespace finegemm;

namespace {
constexpr Device kGpu{DeviceType::CUDA, 0};

template <typename F>
double median_us(F&& fn, int iters = 50) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 5; ++i) fn(i);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(e0);
    fn(i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main() {
  const int64_t m = 4096, k = 7168;
  const int copies = 4;  // 4 × 58.7 MB of bf16 input: over 3× the 60 MB L2
  std::vector<uint16_t> host(static_cast<size_t>(m * k));
  for (size_t i = 0; i < host.size(); ++i) host[i] = fmt::bf16_from_float(static_cast<float>((i * 2654435761u) % 1000) / 250.0f - 2.0f);
  std::vector<DeviceTensor> xs;
  for (int c = 0; c < copies; ++c) xs.push_back(to_device(TensorView::of(host.data(), DType::BF16, {m, k}), kGpu));
  DeviceBuffer q(kGpu, m * k), s(kGpu, m * (k / 32) * 4);
  const double copy_bytes = 2.0 * m * k * 2;
  DeviceBuffer dst(kGpu, m * k * 2);
  const double copy_us = median_us([&](int i) { cudaMemcpyAsync(dst.data(), xs[i % copies].buffer.data(), m * k * 2, cudaMemcpyDeviceToDevice); });
  std::printf("{\"op\": \"copy\", \"m\": %lld, \"k\": %lld, \"us\": %.2f, \"gbps\": %.0f}\n", (long long)m, (long long)k, copy_us, copy_bytes / copy_us / 1e3);
  struct V { const char* name; ActivationRecipe r; int64_t scale_count; };
  const V variants[] = {{"group128", ActivationRecipe::per_token_group(128), m * k / 128},
                        {"group128-pow2", ActivationRecipe::per_token_group(128, true), m * k / 128},
                        {"group32", ActivationRecipe::per_token_group(32), m * k / 32},
                        {"token", ActivationRecipe::per_token(), m},
                        {"static", ActivationRecipe::static_per_tensor(), 1}};
  for (const auto& v : variants) {
    auto shape = activation_scale_shape(v.r, m, k);
    const float static_scale = 4.0f / 448.0f;
    if (v.r.is_static()) cudaMemcpy(s.data(), &static_scale, 4, cudaMemcpyHostToDevice);
    TensorView qv = TensorView::of(q.data(), DType::F8_E4M3, {m, k}, kGpu);
    TensorView sv = TensorView::of(s.data(), DType::F32, shape, kGpu);
    const double us = median_us([&](int i) { quantize_activations(xs[i % copies].view, v.r, qv, sv); });
    const double bytes = m * k * 3.0 + (v.r.is_static() ? 0 : v.scale_count * 4.0);
    std::printf("{\"op\": \"quantize_%s\", \"m\": %lld, \"k\": %lld, \"us\": %.2f, \"gbps\": %.0f, \"of_copy\": %.3f}\n", v.name,
                (long long)m, (long long)k, us, bytes / us / 1e3, (bytes / us) / (copy_bytes / copy_us));
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
