// Activation quantization bandwidth (bf16 → E4M3, M × K = 4096 × 7168) against the device-to-device copy ceiling,
// same run, for every recipe: groups of 32, 64 and 128 (FP32 and power-of-two scales), per token (both), static.
// Every variant is first checked byte for byte against the CPU reference (src/cpu/reference.cpp): on the benchmark
// data itself, and on a small tensor of edge cases in BF16, F16 and F32 (values on and next to every E4M3 rounding
// boundary, subnormal codes, saturation, zeros of both signs, groups below the 1e-4 floor, infinities, NaN).
// A mismatch is printed and the program exits 1 (after timing the rest).
// Kernels are launched as the library launches them (cuda::launch_quantize_activations): group 64 is no public
// recipe yet (validate.cpp takes 32 and 128).
// Bytes counted: input read + E4M3 written + scales written (copy: bytes read + written).
// Timing: 10 launches back to back between two events (so launch gaps do not count), 4 input copies rotated (over 3×
// the L2), median of 30 such samples.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "cpu/cpu_backend.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "finegemm/finegemm.hpp"

using namespace finegemm;

namespace {
constexpr Device kGpu{DeviceType::CUDA, 0};

// Median time of one call, in µs: samples of kBatch calls back to back.
template <typename F>
double median_us(F&& fn, int samples = 30) {
  constexpr int kBatch = 10;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 5; ++i) fn(i);
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    cudaEventRecord(e0);
    for (int i = 0; i < kBatch; ++i) fn(s * kBatch + i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    t.push_back(ms * 1e3 / kBatch);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Variant {
  const char* name;
  ActivationRecipe recipe;
};

int64_t scale_count(const ActivationRecipe& r, int64_t m, int64_t k) {
  switch (r.granularity) {
    case ActGranularity::PerTokenGroup: return m * (k / r.group_size);
    case ActGranularity::PerToken: return m;
    default: return 1;
  }
}

// The GPU's codes and scales for x (host values of `dtype`, [m, k]) against the CPU reference's. NaN codes are
// compared up to their sign (0x7F or 0xFF): the reference keeps a NaN's sign, the GPU's division does not promise to.
// Returns "" or what differs first.
std::string check_against_reference(const void* host_x, DType dtype, int64_t m, int64_t k, const ActivationRecipe& r,
                                    float static_scale, const void* device_x = nullptr) {
  const int64_t n_scales = scale_count(r, m, k);
  std::vector<uint8_t> q_ref(static_cast<size_t>(m * k)), q(q_ref.size());
  std::vector<float> s_ref(static_cast<size_t>(n_scales), static_scale), s(s_ref.size());
  const TensorView x = TensorView::of(host_x, dtype, {m, k});
  const std::vector<int64_t> scale_shape = r.is_static() ? std::vector<int64_t>{} : activation_scale_shape(r, m, k);
  cpu::reference_quantize_activations(x, r, TensorView::of(q_ref.data(), DType::F8_E4M3, {m, k}),
                                      TensorView::of(s_ref.data(), DType::F32, scale_shape));

  DeviceTensor dx;
  if (!device_x) {
    dx = to_device(x, kGpu);
    device_x = dx.view.data;
  }
  DeviceBuffer dq(kGpu, q.size()), ds(kGpu, s.size() * 4);
  std::vector<uint8_t> poison_q(q.size(), 0x5A);  // an unwritten code or scale shows
  std::vector<float> poison_s(s.size(), -1.0f);
  dq.copy_from_host(poison_q.data(), poison_q.size());
  ds.copy_from_host(r.is_static() ? s_ref.data() : poison_s.data(), s.size() * 4);
  cuda::launch_quantize_activations(device_x, dtype, m, k, r, static_cast<uint8_t*>(dq.data()),
                                    static_cast<float*>(ds.data()), nullptr);
  synchronize(kGpu);
  dq.copy_to_host(q.data(), q.size());
  ds.copy_to_host(s.data(), s.size() * 4);

  char what[256];
  for (int64_t i = 0; i < n_scales; ++i) {
    if (std::memcmp(&s[i], &s_ref[i], 4) != 0) {
      std::snprintf(what, sizeof what, "scale %lld: gpu %.9g, cpu %.9g", static_cast<long long>(i), s[i], s_ref[i]);
      return what;
    }
  }
  int64_t wrong = 0, first = -1;
  for (int64_t i = 0; i < m * k; ++i) {
    const bool nan_ref = (q_ref[i] & 0x7F) == 0x7F;
    const bool same = nan_ref ? (q[i] & 0x7F) == 0x7F : q[i] == q_ref[i];
    if (!same && wrong++ == 0) first = i;
  }
  if (wrong == 0) return "";
  float value = 0;
  if (dtype == DType::F32) value = static_cast<const float*>(host_x)[first];
  if (dtype == DType::BF16) value = fmt::bf16_to_float(static_cast<const uint16_t*>(host_x)[first]);
  if (dtype == DType::F16) value = fmt::f16_to_float(static_cast<const uint16_t*>(host_x)[first]);
  std::snprintf(what, sizeof what, "%lld codes differ; first at [%lld, %lld]: x = %.9g, gpu 0x%02x, cpu 0x%02x",
                static_cast<long long>(wrong), static_cast<long long>(first / k), static_cast<long long>(first % k),
                value, q[first], q_ref[first]);
  return what;
}

// ---- Edge cases: for each group (row, for per-token; the tensor, for static) an amax is put first and the other
// values are the floats nearest to b·s and their neighbours, b running over the E4M3 values and the midpoints
// between them (the rounding boundaries), s the scale the reference will derive (or the static one). With
// amax = 448·2^j the scale is a power of two even for FP32 scales, so BF16/F16 values land exactly on ties.
std::vector<float> edge_values(const ActivationRecipe& r, int64_t m, int64_t k, float static_scale) {
  std::vector<double> boundaries;
  for (int c = 0; c < 0x7E; ++c) {
    const double v0 = fmt::e4m3_to_float(static_cast<uint8_t>(c)), v1 = fmt::e4m3_to_float(static_cast<uint8_t>(c + 1));
    boundaries.push_back(v0);
    boundaries.push_back((v0 + v1) / 2);
  }
  boundaries.push_back(448.0);
  if (r.is_static()) boundaries.insert(boundaries.end(), {464.0, 500.0, 1e6});  // saturation
  const float amaxes[] = {1.0f, 3.7f, 0.0173f, 448.0f, 56.0f, 0.4375f, 1e-4f, 3e-5f, 65504.0f, 2.9f};
  const int64_t span = r.granularity == ActGranularity::PerTokenGroup ? r.group_size : k;
  std::vector<float> x(static_cast<size_t>(m * k));
  int64_t b = 0, step = 0;
  for (int64_t g = 0; g < m * k / span; ++g) {
    float* v = x.data() + g * span;
    const float amax = amaxes[g % std::size(amaxes)];
    float s = static_scale;
    if (!r.is_static()) {
      s = std::max(amax, 1e-4f) / fmt::kE4M3Max;
      if (r.pow2_scale) s = fmt::pow2_ceil(s);
    }
    const int64_t first = r.is_static() ? 0 : 1;
    if (!r.is_static()) v[0] = amax;
    for (int64_t i = first; i < span; ++i) {
      float c = static_cast<float>(boundaries[b++ % boundaries.size()] * s);
      uint32_t bits;
      std::memcpy(&bits, &c, 4);
      bits = static_cast<uint32_t>(std::max<int64_t>(0, int64_t{bits} + step++ % 7 - 3));  // -3..3 float steps
      std::memcpy(&c, &bits, 4);
      if (!r.is_static() && !(std::fabs(c) <= amax)) c = amax;  // keep the group's amax
      v[i] = (i % 2) ? -c : c;
    }
  }
  // Zeros of both signs, tiny values, and (last row) infinities and NaN.
  for (int64_t i = 0; i < k; i += 97) x[i + k] = (i % 2) ? -0.0f : 0.0f;
  x[2 * k + 5] = 1e-30f;
  x[2 * k + 6] = -1e-38f;
  const float inf = std::numeric_limits<float>::infinity();
  x[(m - 1) * k + 3] = inf;
  x[(m - 1) * k + 9] = -inf;
  x[(m - 1) * k + 130] = std::numeric_limits<float>::quiet_NaN();
  x[(m - 1) * k + 131] = -std::numeric_limits<float>::quiet_NaN();
  return x;
}

std::vector<uint16_t> to_half_bits(const std::vector<float>& x, DType dtype) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    h[i] = dtype == DType::BF16 ? fmt::bf16_from_float(x[i]) : fmt::f16_from_float(x[i]);
  return h;
}

std::string check_edges(const ActivationRecipe& r, float static_scale) {
  const int64_t m = 16, k = 1024;
  const std::vector<float> x = edge_values(r, m, k, static_scale);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    std::string what;
    if (dtype == DType::F32) what = check_against_reference(x.data(), dtype, m, k, r, static_scale);
    else what = check_against_reference(to_half_bits(x, dtype).data(), dtype, m, k, r, static_scale);
    if (!what.empty()) return std::string(dtype_name(dtype)) + " edge cases: " + what;
  }
  return "";
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
  const Variant variants[] = {{"group128", ActivationRecipe::per_token_group(128)},
                              {"group128-pow2", ActivationRecipe::per_token_group(128, true)},
                              {"group64", ActivationRecipe::per_token_group(64)},
                              {"group64-pow2", ActivationRecipe::per_token_group(64, true)},
                              {"group32", ActivationRecipe::per_token_group(32)},
                              {"group32-pow2", ActivationRecipe::per_token_group(32, true)},
                              {"token", ActivationRecipe::per_token()},
                              {"token-pow2", ActivationRecipe::per_token(true)},
                              {"static", ActivationRecipe::static_per_tensor()}};
  const float static_scale = 4.0f / 448.0f;
  int failures = 0;
  double log_sum = 0;
  for (const auto& v : variants) {
    // Bit-exact against the CPU reference first: edge cases, then the benchmark data.
    std::string what = check_edges(v.recipe, static_scale);
    if (what.empty())
      what = check_against_reference(host.data(), DType::BF16, m, k, v.recipe, static_scale, xs[0].view.data);
    if (!what.empty()) {
      ++failures;
      std::fprintf(stderr, "quantize_%s: NOT bit-exact with the CPU reference: %s\n", v.name, what.c_str());
    }
    if (v.recipe.is_static()) cudaMemcpy(s.data(), &static_scale, 4, cudaMemcpyHostToDevice);
    const double us = median_us([&](int i) {
      cuda::launch_quantize_activations(xs[i % copies].view.data, DType::BF16, m, k, v.recipe,
                                        static_cast<uint8_t*>(q.data()), static_cast<float*>(s.data()), nullptr);
    });
    const double bytes = m * k * 3.0 + (v.recipe.is_static() ? 0 : scale_count(v.recipe, m, k) * 4.0);
    const double of_copy = (bytes / us) / (copy_bytes / copy_us);
    log_sum += std::log(of_copy);
    std::printf("{\"op\": \"quantize_%s\", \"m\": %lld, \"k\": %lld, \"us\": %.2f, \"gbps\": %.0f, \"of_copy\": %.3f, "
                "\"exact\": %s}\n",
                v.name, (long long)m, (long long)k, us, bytes / us / 1e3, of_copy, what.empty() ? "true" : "false");
  }
  std::printf("{\"op\": \"quantize_geomean\", \"of_copy\": %.3f}\n", std::exp(log_sum / std::size(variants)));
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return failures ? 1 : 0;
}
