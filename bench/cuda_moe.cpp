// bench/moe (GPU side): finegemm's MoE block (FP8 experts) on the MoE layers of RECIPES.md at the benchmark token
// counts. For each (layer, recipe, T):
//   1. correctness: the whole layer (moe_experts, Backend::Cuda) against the CPU reference on a few sampled tokens
//      (the block is per-token independent given the routing: each (token, slot) runs as a one-expert reference
//      problem, in parallel), and the step-by-step sequence below against the layer, bit for bit;
//   2. the whole layer timed with CUDA events (median after warm-up), and for T <= 128 as CUDA-graph replay;
//   3. each step timed separately by calling the internal launchers in the layer's sequence with events in between
//      (route, permute+quantize, gate_up GEMM, down GEMM, combine), on scratch allocated once.
// A configuration whose check fails prints its error and no timings. Routing rotates among several random routings
// for T <= 128, so the L2 does not serve a small layer's experts from one call to the next. Expert weights are E4M3
// bytes tiled from a random chunk on the device (no CPU quantization of gigabytes).
// --weights-constant passes RunOptions::weights_constant (the serving promise: FP4 experts' fold scans kept per weight;
// the kept scans are dropped after each configuration) and records it in the output.
// Prints one JSON object per line (bench/moe.py merges them with the torch baselines).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "cuda/runtime/fp4_expand.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/moe.hpp"
#include "cuda/runtime/moe_routing.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"
#include "finegemm/finegemm.hpp"

using namespace finegemm;

namespace {

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr Device kGpu{DeviceType::CUDA, 0};
std::mt19937_64 rng(20261130);

struct Layer {
  std::string name;
  int64_t hidden, inter;
  int experts, top_k;
};
const Layer kLayers[] = {{"deepseek-v3", 7168, 2048, 256, 8}, {"qwen3-30b-a3b", 2048, 768, 128, 8}};

struct Variant {
  std::string name;
  WeightRecipe weight;
  ActivationRecipe activation;
};

bool parse_variant(const std::string& v, Variant* out) {
  if (v == "dynamic" || v == "block-fp32-dynamic")
    *out = {"block-fp32-dynamic", WeightRecipe::block(), ActivationRecipe::per_token_group(128)};
  else if (v == "static" || v == "block-fp32-static")
    *out = {"block-fp32-static", WeightRecipe::block(), ActivationRecipe::static_per_tensor()};
  else if (v == "ue8m0" || v == "block-ue8m0-dynamic")
    *out = {"block-ue8m0-dynamic", WeightRecipe::block(128, 128, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128, true)};
  else if (v == "fp4" || v == "mxfp4-ue8m0-dynamic")  // DeepSeek-V4-style FP4 experts (the E4M3 bytes read as E2M1 pairs)
    *out = {"mxfp4-ue8m0-dynamic", WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128, true)};
  else
    return false;
  return true;
}

std::vector<std::string> split(const char* s) {
  std::vector<std::string> r;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) r.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return r;
}

// A JSON number, or null for NaN/Inf (JSON has neither).
std::string json_num(double v, const char* format = "%.3e") {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Fills `bytes` of device memory with pieces of a random device chunk of `chunk` bytes (the chunk buffer holds
// 2·chunk bytes), each piece starting at a different offset, so neighbouring experts differ.
void tile_fill(void* dst, size_t bytes, const DeviceBuffer& source, size_t chunk) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(source.data());
  size_t piece = 0;
  for (size_t off = 0; off < bytes; off += chunk, ++piece) {
    const size_t n = std::min(chunk, bytes - off);
    const size_t src_off = (piece * 7919 * 16) % chunk;
    CHECK_CUDA(cudaMemcpy(d + off, s + src_off, n, cudaMemcpyDeviceToDevice));
  }
}

// A device chunk (2·chunk bytes) of E4M3 bytes of N(0, 64²) values, quantized on the host once.
DeviceBuffer e4m3_chunk(size_t chunk) {
  std::vector<uint8_t> h(2 * chunk);
  std::normal_distribution<float> d(0.0f, 64.0f);
  for (size_t i = 0; i < chunk; ++i) h[i] = fmt::e4m3_from_float(d(rng));
  std::memcpy(h.data() + chunk, h.data(), chunk);
  DeviceBuffer b(kGpu, h.size());
  b.copy_from_host(h.data(), h.size());
  return b;
}

// The same for bf16 N(0, 1) values.
DeviceBuffer bf16_chunk(size_t chunk) {
  const size_t n = chunk / 2;
  std::vector<uint16_t> h(2 * n);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) h[i] = fmt::bf16_from_float(d(rng));
  std::memcpy(h.data() + n, h.data(), n * 2);
  DeviceBuffer b(kGpu, h.size() * 2);
  b.copy_from_host(h.data(), h.size() * 2);
  return b;
}

// Weight scales of one projection [E, n/128, k/128], bytes as stored (FP32 or UE8M0): |w| ~ 1/sqrt(k).
std::vector<uint8_t> weight_scales(const WeightRecipe& recipe, int experts, int64_t n, int64_t k, int64_t* per_expert) {
  const auto shape = weight_scale_shape(recipe, n, k);
  int64_t count = 1;
  for (auto s : shape) count *= s;
  *per_expert = count;
  std::uniform_real_distribution<float> d(0.5f, 2.0f);
  const float base = 1.0f / (64.0f * std::sqrt(static_cast<float>(k)));
  std::vector<uint8_t> bytes;
  if (recipe.scale_format == ScaleFormat::FP32) {
    bytes.resize(static_cast<size_t>(count * experts * 4));
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (int64_t i = 0; i < count * experts; ++i) f[i] = d(rng) * base;
  } else {
    bytes.resize(static_cast<size_t>(count * experts));
    for (auto& b : bytes) b = fmt::ue8m0_ceil(d(rng) * base);
  }
  return bytes;
}

// Random top-k routing: distinct experts per token, softmax weights over the k chosen logits.
struct HostRouting {
  std::vector<int32_t> index;
  std::vector<float> weights;
  int distinct = 0;  // experts touched
};
HostRouting random_routing(int64_t tokens, int top_k, int experts) {
  HostRouting r;
  r.index.resize(static_cast<size_t>(tokens * top_k));
  r.weights.resize(r.index.size());
  std::uniform_int_distribution<int> pick(0, experts - 1);
  std::normal_distribution<float> logit(0.0f, 1.0f);
  std::vector<char> used(static_cast<size_t>(experts), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* idx = r.index.data() + t * top_k;
    float* w = r.weights.data() + t * top_k;
    for (int j = 0; j < top_k; ++j) {
      int e;
      do e = pick(rng);
      while (std::find(idx, idx + j, e) != idx + j);
      idx[j] = e;
      used[e] = 1;
      w[j] = logit(rng);
    }
    const float mx = *std::max_element(w, w + top_k);
    float sum = 0;
    for (int j = 0; j < top_k; ++j) sum += (w[j] = std::exp(w[j] - mx));
    for (int j = 0; j < top_k; ++j) w[j] /= sum;
  }
  r.distinct = static_cast<int>(std::count(used.begin(), used.end(), 1));
  return r;
}

// Everything of one layer that stays on the device across T and recipes.
struct LayerData {
  Layer layer;
  DeviceBuffer gate_up, down;  // [E, 2I, H], [E, H, I] E4M3
  DeviceBuffer hidden;         // [T_max, H] bf16
};

// One variant's scales, on the host (for the reference) and the device.
struct VariantData {
  std::vector<uint8_t> gate_up_scale, down_scale;  // bytes as stored
  int64_t gate_up_scale_per_expert = 0, down_scale_per_expert = 0;
  std::vector<float> gate_up_static, down_static;  // [E], static recipe only
  DeviceTensor gate_up_scale_dev, down_scale_dev, gate_up_static_dev, down_static_dev;
};

// The step-by-step replica of src/cuda/runtime/moe.cu for FP8 block weights and dynamic group / static activations,
// on scratch allocated once: route → permute+quantize → gate_up (ActRequant) → down (Store, routing weight) → combine.
struct Steps {
  int64_t tokens = 0, hidden = 0, inter = 0, rows = 0;
  int top_k = 0, experts = 0;
  bool dynamic = true, y_f32 = true, fp4 = false;
  DeviceBuffer offsets, row_token, row_expert, row_weight, slot_row, error_count, route_ws, x_q, x_scale, h_q, h_scale, y;
  cuda::MoeRouting routing;

  Steps(const MoeArgs& a) {
    tokens = a.hidden.shape[0];
    hidden = a.hidden.shape[1];
    fp4 = a.weight_recipe.element == ElementType::FP4_E2M1;
    inter = a.down.shape[2] * (fp4 ? 2 : 1);
    top_k = static_cast<int>(a.top_k_index.shape[1]);
    experts = static_cast<int>(a.gate_up.shape[0]);
    rows = tokens * top_k;
    dynamic = !a.activation_recipe.is_static();
    const int group = a.activation_recipe.group_size;
    auto buf = [](size_t bytes) { return DeviceBuffer(kGpu, std::max<size_t>(bytes, 16)); };
    offsets = buf((experts + 1) * 4);
    row_token = buf(rows * 4);
    row_expert = buf(rows * 4);
    row_weight = buf(rows * 4);
    slot_row = buf(rows * 4);
    error_count = buf(4);
    route_ws = buf(cuda::moe_route_workspace_bytes(tokens, top_k, experts));
    x_q = buf(rows * hidden);
    x_scale = buf(dynamic ? rows * (hidden / group) * 4 : 16);
    h_q = buf(rows * inter);
    h_scale = buf(dynamic ? rows * (inter / group) * 4 : 16);
    y_f32 = rows * hidden * 4 <= (int64_t(1) << 30);  // as moe.cu decides
    y = buf(rows * hidden * (y_f32 ? 4 : 2));
    routing.expert_offsets = static_cast<int32_t*>(offsets.data());
    routing.row_token = static_cast<int32_t*>(row_token.data());
    routing.row_expert = static_cast<int32_t*>(row_expert.data());
    routing.row_weight = static_cast<float*>(row_weight.data());
    routing.slot_row = static_cast<int32_t*>(slot_row.data());
    routing.error_count = static_cast<int32_t*>(error_count.data());
  }

  // The same recipe → GemmParams mapping as moe.cu (src/cuda/runtime/gemm_args.hpp).
  static void set_activation(cuda::GemmParams& p, const ActivationRecipe& r, const float* x_scale, int64_t k,
                             const float* static_scales) {
    cuda::set_activation_scales(p, r, x_scale, r.is_static() ? 0 : k / r.group_size, 1, k, static_scales);
  }
  static void set_weight(cuda::GemmParams& p, const WeightRecipe& r, const TensorView& scale, int64_t n, int64_t k) {
    cuda::set_weight_scales(p, r, scale, n, k);
  }

  // Runs the five steps on `stream`; ev (6 events, or nullptr) are recorded between them.
  void run(const MoeArgs& a, cudaStream_t stream, cudaEvent_t* ev) {
    const auto& act = a.activation_recipe;
    const float* gate_up_static = a.gate_up_act_scale.defined() ? a.gate_up_act_scale.ptr<float>() : nullptr;
    const float* down_static = a.down_act_scale.defined() ? a.down_act_scale.ptr<float>() : nullptr;
    if (ev) CHECK_CUDA(cudaEventRecord(ev[0], stream));
    cuda::launch_moe_route(a.top_k_index.data, a.top_k_index.dtype, a.top_k_weights.data, a.top_k_weights.dtype, tokens,
                           top_k, experts, routing, route_ws.data(), stream);
    if (ev) CHECK_CUDA(cudaEventRecord(ev[1], stream));
    // The rows in the FP4 decode kernel's order where moe_experts writes them so (FINEGEMM_FP4_DECODE_PERM=1).
    const bool perm_k = cuda::moe_decode_path(a, rows) && cuda::moe_decode_perm_wanted(a, rows);
    cuda::launch_moe_permute_quantize(a.hidden.data, a.hidden.dtype, tokens, hidden, top_k, routing, act, gate_up_static,
                                      static_cast<uint8_t*>(x_q.data()), static_cast<float*>(x_scale.data()), stream,
                                      false, perm_k);
    if (ev) CHECK_CUDA(cudaEventRecord(ev[2], stream));
    if (cuda::moe_decode_path(a, rows) || fp4 || cuda::moe_gate_up_unfused(rows, a.gate_up.shape[1])) {
      // The decode path, FP4 experts and the unfused gate_up (moe.cu): both GEMMs and what runs between them as one
      // step ("gate_up_us"; down 0). The replica below is of the FP8 grouped path only.
      cuda::PermutedRows in;
      in.x_q = static_cast<const uint8_t*>(x_q.data());
      in.x_scale = static_cast<const float*>(x_scale.data());
      in.row_weight = routing.row_weight;
      in.expert_offsets = routing.expert_offsets;
      in.rows = rows;
      in.num_experts = experts;
      in.gate_up_act_scale = gate_up_static;
      in.down_act_scale = down_static;
      in.perm_k = perm_k;
      cuda::moe_expert_gemms(a, in, y.data(), y_f32, stream);
      if (ev) CHECK_CUDA(cudaEventRecord(ev[3], stream));
      if (ev) CHECK_CUDA(cudaEventRecord(ev[4], stream));
      cuda::launch_moe_combine(y.data(), y_f32 ? DType::F32 : DType::BF16, routing, tokens, top_k, hidden, a.out.data,
                               a.out.dtype, stream);
      if (ev) CHECK_CUDA(cudaEventRecord(ev[5], stream));
      return;
    }
    cuda::GroupedLayout layout;
    layout.offsets = routing.expert_offsets;
    layout.num_groups = experts;
    layout.expected_rows_per_group = rows / std::max(1, experts);
    const int64_t gate_up_rows = a.gate_up.shape[1];
    {
      cuda::GemmParams p;
      p.m = static_cast<int>(rows);
      p.n = static_cast<int>(gate_up_rows);
      p.k = static_cast<int>(hidden);
      p.promote_k = 128;
      set_activation(p, act, static_cast<const float*>(x_scale.data()), hidden, gate_up_static);
      set_weight(p, a.weight_recipe, a.gate_up_scale, gate_up_rows, hidden);
      p.b_layout = cuda::BLayout::GateUpHalves;
      p.gate_up_split = static_cast<int>(inter);
      p.act_kind = static_cast<int>(a.activation);
      p.swiglu_limit = a.swiglu_limit;
      p.swiglu_alpha = a.swiglu_alpha;
      p.requant_group = dynamic ? act.group_size : 0;
      p.requant_pow2 = act.pow2_scale;
      p.requant_static = dynamic ? nullptr : down_static;
      p.out_q = static_cast<uint8_t*>(h_q.data());
      p.out_q_scale = static_cast<float*>(h_scale.data());
      p.ld_q = inter;
      p.ld_q_scale = dynamic ? inter / act.group_size : 0;
      p.out_cols = static_cast<int>(inter);
      cuda::launch_sm90_fp8_grouped_gemm(x_q.data(), hidden, a.gate_up.data, hidden, layout, cuda::Epilogue::ActRequant,
                                         p, stream);
    }
    if (ev) CHECK_CUDA(cudaEventRecord(ev[3], stream));
    {
      cuda::GemmParams p;
      p.m = static_cast<int>(rows);
      p.n = static_cast<int>(hidden);
      p.k = static_cast<int>(inter);
      p.promote_k = 128;
      set_activation(p, act, static_cast<const float*>(h_scale.data()), inter, down_static);
      set_weight(p, a.weight_recipe, a.down_scale, hidden, inter);
      p.row_weight = routing.row_weight;
      p.out = y.data();
      p.out_dtype = y_f32 ? cuda::OutDType::F32 : cuda::OutDType::BF16;
      p.ldo = hidden;
      cuda::launch_sm90_fp8_grouped_gemm(h_q.data(), inter, a.down.data, inter, layout, cuda::Epilogue::Store, p, stream);
    }
    if (ev) CHECK_CUDA(cudaEventRecord(ev[4], stream));
    cuda::launch_moe_combine(y.data(), y_f32 ? DType::F32 : DType::BF16, routing, tokens, top_k, hidden, a.out.data,
                             a.out.dtype, stream);
    if (ev) CHECK_CUDA(cudaEventRecord(ev[5], stream));
  }
};

struct Check {
  double rel = INFINITY;
  int non_finite = 0;
};

// The layer's output on sampled tokens against the CPU reference. Each routed (token, slot) is a one-expert
// reference problem (its expert's weights copied back from the device), run in parallel; the slots are summed in
// slot order in double, as the reference's own combine does.
Check check_tokens(const LayerData& ld, const Variant& var, const VariantData& vd, const HostRouting& routing,
                   int64_t tokens, const std::vector<uint16_t>& gpu_out, int samples) {
  const auto& L = ld.layer;
  const int64_t H = L.hidden, I = L.inter, k = L.top_k;
  std::vector<int64_t> sampled;
  for (int64_t t : {int64_t(0), tokens - 1, tokens / 2, tokens / 3, (tokens * 7) / 9, tokens / 5})
    if (static_cast<int>(sampled.size()) < samples && std::find(sampled.begin(), sampled.end(), t) == sampled.end())
      sampled.push_back(t);
  const int64_t items = static_cast<int64_t>(sampled.size()) * k;
  // FP4 experts: the same device bytes, read as packed E2M1 [rows, K/2].
  const bool fp4 = var.weight.element == ElementType::FP4_E2M1;
  const DType w_dtype = fp4 ? DType::U8 : DType::F8_E4M3;
  const size_t gu_bytes = static_cast<size_t>(2 * I * H) / (fp4 ? 2 : 1), dn_bytes = static_cast<size_t>(H * I) / (fp4 ? 2 : 1);
  const size_t scale_elem = var.weight.scale_format == ScaleFormat::FP32 ? 4 : 1;
  std::vector<std::vector<uint8_t>> gu(items), dn(items);
  std::vector<std::vector<uint16_t>> x(sampled.size(), std::vector<uint16_t>(static_cast<size_t>(H)));
  for (size_t s = 0; s < sampled.size(); ++s) {
    CHECK_CUDA(cudaMemcpy(x[s].data(), static_cast<uint16_t*>(ld.hidden.data()) + sampled[s] * H, H * 2,
                          cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = routing.index[sampled[s] * k + j];
      auto& g = gu[s * k + j];
      auto& d = dn[s * k + j];
      g.resize(gu_bytes);
      d.resize(dn_bytes);
      CHECK_CUDA(cudaMemcpy(g.data(), static_cast<uint8_t*>(ld.gate_up.data()) + e * gu_bytes, gu_bytes, cudaMemcpyDeviceToHost));
      CHECK_CUDA(cudaMemcpy(d.data(), static_cast<uint8_t*>(ld.down.data()) + e * dn_bytes, dn_bytes, cudaMemcpyDeviceToHost));
    }
  }
  std::vector<std::vector<float>> slot_out(items, std::vector<float>(static_cast<size_t>(H)));
  const auto gu_scale_shape = weight_scale_shape(var.weight, 2 * I, H);
  const auto dn_scale_shape = weight_scale_shape(var.weight, H, I);
  const DType scale_dtype = weight_scale_dtype(var.weight);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t s = item / k, j = item % k, t = sampled[s];
    const int64_t e = routing.index[t * k + j];
    const int32_t idx = 0;
    const float w = routing.weights[t * k + j];
    MoeArgs a;
    a.hidden = TensorView::of(x[s].data(), DType::BF16, {1, H});
    a.top_k_index = TensorView::of(&idx, DType::I32, {1, 1});
    a.top_k_weights = TensorView::of(&w, DType::F32, {1, 1});
    a.gate_up = TensorView::of(gu[item].data(), w_dtype, {1, 2 * I, fp4 ? H / 2 : H});
    a.gate_up_scale = TensorView::of(vd.gate_up_scale.data() + e * vd.gate_up_scale_per_expert * scale_elem, scale_dtype,
                                     {1, gu_scale_shape[0], gu_scale_shape[1]});
    a.down = TensorView::of(dn[item].data(), w_dtype, {1, H, fp4 ? I / 2 : I});
    a.down_scale = TensorView::of(vd.down_scale.data() + e * vd.down_scale_per_expert * scale_elem, scale_dtype,
                                  {1, dn_scale_shape[0], dn_scale_shape[1]});
    a.weight_recipe = var.weight;
    a.activation_recipe = var.activation;
    if (var.activation.is_static()) {
      a.gate_up_act_scale = TensorView::of(&vd.gate_up_static[e], DType::F32, {1});
      a.down_act_scale = TensorView::of(&vd.down_static[e], DType::F32, {1});
    }
    a.out = TensorView::of(slot_out[item].data(), DType::F32, {1, H});
    moe_experts(a, {Backend::Reference});
  }
  Check c;
  double num = 0, den = 0;
  for (size_t s = 0; s < sampled.size(); ++s) {
    for (int64_t col = 0; col < H; ++col) {
      double ref = 0;
      for (int64_t j = 0; j < k; ++j) ref += slot_out[s * k + j][col];
      const double o = fmt::bf16_to_float(gpu_out[sampled[s] * H + col]);
      if (!std::isfinite(o)) {
        ++c.non_finite;
        continue;
      }
      num += (o - ref) * (o - ref);
      den += ref * ref;
    }
  }
  c.rel = c.non_finite ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> token_counts = {1, 16, 128, 1024, 4096, 16384};
  std::vector<std::string> layer_names = {"deepseek-v3", "qwen3-30b-a3b"};
  std::vector<std::string> variant_names = {"dynamic"};
  int samples = 4;
  int iter_scale = 1;
  double tolerance = 1e-2;
  bool keep_pool = true;
  bool weights_constant = false;  // RunOptions::weights_constant (the serving promise)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) {
      token_counts.clear();
      for (const auto& s : split(argv[++i])) token_counts.push_back(std::atoll(s.c_str()));
    } else if (a == "--layers" && i + 1 < argc) {
      layer_names = split(argv[++i]);
    } else if (a == "--recipes" && i + 1 < argc) {
      variant_names = split(argv[++i]);
    } else if (a == "--check-tokens" && i + 1 < argc) {
      samples = std::atoi(argv[++i]);
    } else if (a == "--iter-scale" && i + 1 < argc) {
      iter_scale = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--tolerance" && i + 1 < argc) {
      tolerance = std::atof(argv[++i]);
    } else if (a == "--default-pool") {
      keep_pool = false;
    } else if (a == "--weights-constant") {
      weights_constant = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_cuda_moe [--layers deepseek-v3,qwen3-30b-a3b] [--tokens 1,16,...] "
                   "[--recipes dynamic,static,ue8m0,fp4] [--check-tokens 4] [--iter-scale 1] [--tolerance 1e-2] "
                   "[--default-pool] [--weights-constant]\n");
      return 2;
    }
  }
  std::vector<Variant> variants;
  for (const auto& v : variant_names) {
    Variant var;
    if (!parse_variant(v, &var)) {
      std::fprintf(stderr, "--recipes: unknown recipe '%s' (expected dynamic, static, ue8m0 or fp4)\n", v.c_str());
      return 2;
    }
    variants.push_back(var);
  }
  std::vector<Layer> layers;
  for (const auto& n : layer_names) {
    auto it = std::find_if(std::begin(kLayers), std::end(kLayers), [&](const Layer& l) { return l.name == n; });
    if (it == std::end(kLayers)) {
      std::fprintf(stderr, "--layers: unknown layer '%s' (expected deepseek-v3 or qwen3-30b-a3b)\n", n.c_str());
      return 2;
    }
    layers.push_back(*it);
  }
  const int64_t t_max = *std::max_element(token_counts.begin(), token_counts.end());

  // moe_experts takes its scratch from finegemm's pool per device, which keeps what was freed (as a framework's
  // caching allocator does); --default-pool makes it use CUDA's default pool (memory given back at every sync).
  if (!keep_pool) setenv("FINEGEMM_SCRATCH_POOL", "default", 1);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev[6];
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  int failures = 0;

  for (const auto& L : layers) {
    const int64_t H = L.hidden, I = L.inter;
    LayerData ld{L, DeviceBuffer(kGpu, static_cast<size_t>(L.experts * 2 * I * H)),
                 DeviceBuffer(kGpu, static_cast<size_t>(L.experts * H * I)), DeviceBuffer(kGpu, static_cast<size_t>(t_max * H * 2))};
    {
      const size_t chunk = size_t(8) << 20;
      const DeviceBuffer w = e4m3_chunk(chunk);
      tile_fill(ld.gate_up.data(), ld.gate_up.bytes(), w, chunk);
      tile_fill(ld.down.data(), ld.down.bytes(), w, chunk);
      const DeviceBuffer x = bf16_chunk(chunk);
      tile_fill(ld.hidden.data(), ld.hidden.bytes(), x, chunk);
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    for (const auto& var : variants) {
      VariantData vd;
      vd.gate_up_scale = weight_scales(var.weight, L.experts, 2 * I, H, &vd.gate_up_scale_per_expert);
      vd.down_scale = weight_scales(var.weight, L.experts, H, I, &vd.down_scale_per_expert);
      const auto gus = weight_scale_shape(var.weight, 2 * I, H), dns = weight_scale_shape(var.weight, H, I);
      const DType sdt = weight_scale_dtype(var.weight);
      vd.gate_up_scale_dev = to_device(TensorView::of(vd.gate_up_scale.data(), sdt, {L.experts, gus[0], gus[1]}), kGpu);
      vd.down_scale_dev = to_device(TensorView::of(vd.down_scale.data(), sdt, {L.experts, dns[0], dns[1]}), kGpu);
      if (var.activation.is_static()) {
        // x ~ N(0, 1): amax ≈ 4.5; the intermediate silu(g)·u with g, u ~ N(0, ~1.3²): amax ≈ 16.
        std::uniform_real_distribution<float> d(0.9f, 1.1f);
        for (int e = 0; e < L.experts; ++e) {
          vd.gate_up_static.push_back(4.5f / 448.0f * d(rng));
          vd.down_static.push_back(16.0f / 448.0f * d(rng));
        }
        vd.gate_up_static_dev = to_device(TensorView::of(vd.gate_up_static.data(), DType::F32, {L.experts}), kGpu);
        vd.down_static_dev = to_device(TensorView::of(vd.down_static.data(), DType::F32, {L.experts}), kGpu);
      }
      const bool fp4 = var.weight.element == ElementType::FP4_E2M1;
      const double expert_bytes = static_cast<double>(3 * I * H) / (fp4 ? 2 : 1) +
                                  static_cast<double>(vd.gate_up_scale_per_expert + vd.down_scale_per_expert) *
                                      (var.weight.scale_format == ScaleFormat::FP32 ? 4 : 1);

      for (int64_t T : token_counts) {
        const int64_t rows = T * L.top_k;
        // Routings rotate for T <= 128 (L2 must not serve the experts of the previous call).
        const int num_routings = T <= 128 ? 8 : 1;
        std::vector<HostRouting> routings;
        std::vector<DeviceTensor> idx_dev, w_dev;
        double distinct_mean = 0;
        for (int r = 0; r < num_routings; ++r) {
          routings.push_back(random_routing(T, L.top_k, L.experts));
          idx_dev.push_back(to_device(TensorView::of(routings.back().index.data(), DType::I32, {T, L.top_k}), kGpu));
          w_dev.push_back(to_device(TensorView::of(routings.back().weights.data(), DType::F32, {T, L.top_k}), kGpu));
          distinct_mean += routings.back().distinct / double(num_routings);
        }
        DeviceBuffer out(kGpu, static_cast<size_t>(T * H * 2)), out_steps(kGpu, static_cast<size_t>(T * H * 2));
        CHECK_CUDA(cudaMemset(out.data(), 0xFF, out.bytes()));  // poison: NaN in bf16
        CHECK_CUDA(cudaMemset(out_steps.data(), 0xFF, out_steps.bytes()));

        MoeArgs args;
        args.hidden = TensorView::of(ld.hidden.data(), DType::BF16, {T, H}, kGpu);
        args.gate_up = TensorView::of(ld.gate_up.data(), fp4 ? DType::U8 : DType::F8_E4M3,
                                      {L.experts, 2 * I, fp4 ? H / 2 : H}, kGpu);
        args.gate_up_scale = vd.gate_up_scale_dev.view;
        args.down = TensorView::of(ld.down.data(), fp4 ? DType::U8 : DType::F8_E4M3, {L.experts, H, fp4 ? I / 2 : I}, kGpu);
        args.down_scale = vd.down_scale_dev.view;
        args.weight_recipe = var.weight;
        args.activation_recipe = var.activation;
        if (var.activation.is_static()) {
          args.gate_up_act_scale = vd.gate_up_static_dev.view;
          args.down_act_scale = vd.down_static_dev.view;
        }
        args.activation = MoeActivation::SwiGLU;
        auto with_routing = [&](MoeArgs a, int r, void* out_ptr) {
          a.top_k_index = idx_dev[r].view;
          a.top_k_weights = w_dev[r].view;
          a.out = TensorView::of(out_ptr, DType::BF16, {T, H}, kGpu);
          return a;
        };
        RunOptions opt{Backend::Cuda, stream};
        opt.weights_constant = weights_constant;

        // 1. Correctness: the layer vs the CPU reference; the step sequence vs the layer, bit for bit.
        const MoeArgs a0 = with_routing(args, 0, out.data());
        moe_experts(a0, opt);
        Steps steps(a0);
        const MoeArgs s0 = with_routing(args, 0, out_steps.data());
        steps.run(s0, stream, nullptr);
        CHECK_CUDA(cudaStreamSynchronize(stream));
        std::vector<uint16_t> out_host(static_cast<size_t>(T * H)), steps_host(out_host.size());
        CHECK_CUDA(cudaMemcpy(out_host.data(), out.data(), out_host.size() * 2, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(steps_host.data(), out_steps.data(), steps_host.size() * 2, cudaMemcpyDeviceToHost));
        const bool steps_match = std::memcmp(out_host.data(), steps_host.data(), out_host.size() * 2) == 0;
        Check chk;
        chk.rel = NAN;  // --check-tokens 0: not checked (rel_err null)
        if (samples > 0) chk = check_tokens(ld, var, vd, routings[0], T, out_host, samples);
        int error_count = 0;
        CHECK_CUDA(cudaMemcpy(&error_count, steps.routing.error_count, 4, cudaMemcpyDeviceToHost));
        const bool ok = (samples == 0 || chk.rel <= tolerance) && chk.non_finite == 0 && error_count == 0;
        if (!ok) {
          ++failures;
          std::printf("{\"layer\": \"%s\", \"variant\": \"%s\", \"T\": %lld, \"check\": \"failed\", \"rel_err\": %s, "
                      "\"non_finite\": %d, \"route_errors\": %d, \"steps_match_layer\": %s}\n",
                      L.name.c_str(), var.name.c_str(), (long long)T, json_num(chk.rel).c_str(), chk.non_finite, error_count,
                      steps_match ? "true" : "false");
          std::fflush(stdout);
          continue;
        }

        const int iters = (T >= 4096 ? 10 : T >= 1024 ? 20 : 50) * iter_scale;
        const int warmup = 3;
        // 2. The whole layer, events around each call.
        std::vector<double> layer_t;
        for (int it = 0; it < warmup + iters; ++it) {
          const MoeArgs a = with_routing(args, it % num_routings, out.data());
          CHECK_CUDA(cudaEventRecord(ev[0], stream));
          moe_experts(a, opt);
          CHECK_CUDA(cudaEventRecord(ev[1], stream));
          CHECK_CUDA(cudaEventSynchronize(ev[1]));
          float ms = 0;
          CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
          if (it >= warmup) layer_t.push_back(ms * 1e3);
        }
        // The whole layer as graph replay: one graph of one call per routing.
        double us_graph = 0;
        if (T <= 128) {
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int r = 0; r < num_routings; ++r) moe_experts(with_routing(args, r, out.data()), opt);
          CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
          CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
          CHECK_CUDA(cudaGraphLaunch(exec, stream));
          CHECK_CUDA(cudaStreamSynchronize(stream));
          std::vector<double> g;
          for (int rep = 0; rep < 20; ++rep) {
            CHECK_CUDA(cudaEventRecord(ev[0], stream));
            CHECK_CUDA(cudaGraphLaunch(exec, stream));
            CHECK_CUDA(cudaEventRecord(ev[1], stream));
            CHECK_CUDA(cudaEventSynchronize(ev[1]));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, ev[0], ev[1]));
            g.push_back(ms * 1e3 / num_routings);
          }
          us_graph = median(g);
          CHECK_CUDA(cudaGraphExecDestroy(exec));
          CHECK_CUDA(cudaGraphDestroy(graph));
        }
        // 3. Each step, events in between.
        std::vector<double> step_t[5];
        for (int it = 0; it < warmup + iters; ++it) {
          steps.run(with_routing(args, it % num_routings, out_steps.data()), stream, ev);
          CHECK_CUDA(cudaEventSynchronize(ev[5]));
          if (it < warmup) continue;
          for (int s = 0; s < 5; ++s) {
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, ev[s], ev[s + 1]));
            step_t[s].push_back(ms * 1e3);
          }
        }
        double step_us[5], steps_sum = 0;
        for (int s = 0; s < 5; ++s) steps_sum += (step_us[s] = median(step_t[s]));
        const double gemm_us = step_us[2] + step_us[3];
        const double flops = 2.0 * rows * (2.0 * I * H + H * I);
        const double touched_bytes = distinct_mean * expert_bytes;
        std::printf("{\"layer\": \"%s\", \"variant\": \"%s\", \"T\": %lld, \"H\": %lld, \"I\": %lld, \"E\": %d, "
                    "\"top_k\": %d, \"rows\": %lld, \"check\": \"ok\", \"rel_err\": %s, \"check_tokens\": %d, "
                    "\"steps_match_layer\": %s, \"layer_us\": %.3f, \"layer_us_graph\": %.3f, \"route_us\": %.3f, "
                    "\"permute_us\": %.3f, \"gate_up_us\": %.3f, \"down_us\": %.3f, \"combine_us\": %.3f, "
                    "\"steps_us\": %.3f, \"gemm_tflops\": %.1f, \"experts_touched\": %.2f, \"weight_bytes\": %.0f, "
                    "\"weight_tbps\": %.3f, \"iters\": %d, \"routings\": %d, \"path\": \"%s\", "
                    "\"weights_constant\": %s}\n",
                    L.name.c_str(), var.name.c_str(), (long long)T, (long long)H, (long long)I, L.experts, L.top_k,
                    (long long)rows, json_num(chk.rel).c_str(), samples, steps_match ? "true" : "false", median(layer_t), us_graph,
                    step_us[0], step_us[1], step_us[2], step_us[3], step_us[4], steps_sum, flops / gemm_us / 1e6,
                    distinct_mean, touched_bytes, touched_bytes / gemm_us / 1e6, iters, num_routings,
                    cuda::moe_decode_path(args, rows) ? "decode" : "grouped", weights_constant ? "true" : "false");
        std::fflush(stdout);
        // The kept scans belong to these weights, whose memory the next layer or recipe may take.
        if (weights_constant) cuda::fp4_scan_cache_clear();
      }
    }
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return failures ? 1 : 0;
}
