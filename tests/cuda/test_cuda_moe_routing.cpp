// CUDA MoE routing, permute+quantize and combine (src/cuda/runtime/moe_routing.hpp) against plain host computations:
// routing must match the deterministic order (rows of expert e ordered by (t, j)) exactly, the permuted activations
// must match the CPU reference quantizer bit for bit, and combine must match a host fp32 sum in slot order bit for
// bit. Routing includes -1 slots, an empty expert, an expert that takes every token, duplicate experts within a
// token and out-of-range entries. Outputs are poisoned (0xFF) first. Skips itself when no GPU is present (the
// argument checks run everywhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/device_buffer.hpp"
#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/runtime/check.hpp"
#include "cuda/runtime/moe_routing.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

using cuda::MoeRouting;
using testing::Buffer;

constexpr Device kGpu{DeviceType::CUDA, 0};

class CudaMoeRouting : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// ---- device helpers

DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(kGpu, bytes);
  std::vector<uint8_t> ff(bytes ? bytes : 1, 0xFF);
  b.copy_from_host(ff.data(), bytes);
  return b;
}
DeviceBuffer upload(const Buffer& host) {
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_size(host.view.dtype);
  DeviceBuffer b(kGpu, bytes);
  b.copy_from_host(host.bytes.data(), bytes);
  return b;
}
template <typename T>
std::vector<T> download(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  b.copy_to_host(v.data(), count * sizeof(T));
  return v;
}
std::vector<uint8_t> download_bytes(const DeviceBuffer& b) { return download<uint8_t>(b, b.bytes()); }

// ---- routing inputs

struct RouteShape {
  int64_t tokens;
  int top_k;
  int experts;
  DType index_dtype;
  DType weight_dtype;
};
std::string describe(const RouteShape& s) {
  return "T=" + std::to_string(s.tokens) + " k=" + std::to_string(s.top_k) + " E=" + std::to_string(s.experts) +
         " index=" + dtype_name(s.index_dtype) + " weights=" + dtype_name(s.weight_dtype);
}

struct RouteInput {
  RouteShape shape;
  std::vector<int64_t> index;  // [T·k], the values stored in top_k_index
  Buffer index_buffer, weights;
};

// Random routing: ~10% skipped slots, ~3% out-of-range entries (int64 ones that would wrap into range as int32),
// duplicate experts within ~10% of the tokens, expert 1 never used (E ≥ 3), expert E-1 in every token but token 2,
// which routes nowhere (T > 2).
RouteInput make_route_input(const RouteShape& s) {
  RouteInput in;
  in.shape = s;
  const int64_t slots = s.tokens * s.top_k;
  in.index.resize(static_cast<size_t>(slots));
  auto& gen = testing::rng();
  std::uniform_int_distribution<int> expert(0, s.experts - 1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const int64_t e = s.experts;
  const std::vector<int64_t> invalid32 = {-2, -7, e, e + 3, INT32_MIN, INT32_MAX};
  const std::vector<int64_t> invalid64 = {-2, e, int64_t{1} << 32, (int64_t{1} << 32) + 2, -(int64_t{1} << 32) - 1,
                                          INT64_MIN};
  const auto& invalid = s.index_dtype == DType::I64 ? invalid64 : invalid32;
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int j = 0; j < s.top_k; ++j) {
      int64_t v = expert(gen);
      if (s.experts >= 3 && v == 1) v = 0;  // expert 1 stays empty
      const float r = u(gen);
      if (r < 0.10f) v = -1;
      else if (r < 0.13f) v = invalid[std::uniform_int_distribution<size_t>(0, invalid.size() - 1)(gen)];
      in.index[t * s.top_k + j] = v;
    }
    if (s.top_k > 1 && u(gen) < 0.10f) in.index[t * s.top_k + 1] = in.index[t * s.top_k];  // duplicate slot
    in.index[t * s.top_k + t % s.top_k] = s.experts - 1;                                  // the hot expert
  }
  if (s.tokens > 2)
    for (int j = 0; j < s.top_k; ++j) in.index[2 * s.top_k + j] = -1;  // a token with no routed slot
  in.index_buffer = Buffer(s.index_dtype, {s.tokens, s.top_k});
  for (int64_t i = 0; i < slots; ++i) {
    if (s.index_dtype == DType::I64) in.index_buffer.ptr<int64_t>()[i] = in.index[i];
    else in.index_buffer.ptr<int32_t>()[i] = static_cast<int32_t>(in.index[i]);
  }
  in.weights = testing::random_tensor(s.weight_dtype, {s.tokens, s.top_k}, 0.5f);
  return in;
}

// The expected routing: rows of expert e are [offsets[e], offsets[e+1]), ordered by slot i = t·k + j.
struct HostRouting {
  std::vector<int32_t> offsets, row_token, row_expert, slot_row;
  std::vector<float> row_weight;
  int32_t errors = 0;
  int32_t total = 0;
};
HostRouting host_route(const RouteInput& in) {
  const RouteShape& s = in.shape;
  const int64_t slots = s.tokens * s.top_k;
  HostRouting h;
  std::vector<int32_t> counts(s.experts, 0);
  for (int64_t v : in.index) {
    if (v >= 0 && v < s.experts) ++counts[v];
    else if (v != -1) ++h.errors;
  }
  h.offsets.assign(s.experts + 1, 0);
  for (int e = 0; e < s.experts; ++e) h.offsets[e + 1] = h.offsets[e] + counts[e];
  h.total = h.offsets[s.experts];
  h.row_token.assign(h.total, -1);
  h.row_expert.assign(h.total, -1);
  h.row_weight.assign(h.total, 0.0f);
  h.slot_row.assign(slots, -1);
  std::vector<int32_t> next(h.offsets.begin(), h.offsets.end() - 1);
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t v = in.index[i];
    if (v < 0 || v >= s.experts) continue;
    const int32_t row = next[v]++;
    h.slot_row[i] = row;
    h.row_token[row] = static_cast<int32_t>(i / s.top_k);
    h.row_expert[row] = static_cast<int32_t>(v);
    h.row_weight[row] = testing::get(in.weights, i);
  }
  return h;
}

// Device routing buffers, poisoned, with the inputs uploaded.
struct GpuRouting {
  DeviceBuffer index, weights, offsets, row_token, row_expert, row_weight, slot_row, error_count, workspace;
  RouteShape shape;

  explicit GpuRouting(const RouteInput& in) : shape(in.shape) {
    const auto& s = in.shape;
    const size_t slots = static_cast<size_t>(s.tokens * s.top_k);
    index = upload(in.index_buffer);
    weights = upload(in.weights);
    offsets = poisoned((s.experts + 1) * 4);
    row_token = poisoned(slots * 4);
    row_expert = poisoned(slots * 4);
    row_weight = poisoned(slots * 4);
    slot_row = poisoned(slots * 4);
    error_count = poisoned(4);
    workspace = poisoned(cuda::moe_route_workspace_bytes(s.tokens, s.top_k, s.experts));
  }
  MoeRouting view() const {
    MoeRouting r;
    r.expert_offsets = static_cast<int32_t*>(offsets.data());
    r.row_token = static_cast<int32_t*>(row_token.data());
    r.row_expert = static_cast<int32_t*>(row_expert.data());
    r.row_weight = static_cast<float*>(row_weight.data());
    r.slot_row = static_cast<int32_t*>(slot_row.data());
    r.error_count = static_cast<int32_t*>(error_count.data());
    return r;
  }
  void route(cudaStream_t stream = nullptr) const {
    cuda::launch_moe_route(index.data(), shape.index_dtype, weights.data(), shape.weight_dtype, shape.tokens,
                           shape.top_k, shape.experts, view(), workspace.data(), stream);
  }
};

// Every routing output equals the host's; rows past the routed ones are left untouched (still poison).
void expect_routing_matches(const GpuRouting& g, const HostRouting& h, const std::string& what) {
  const auto& s = g.shape;
  const size_t slots = static_cast<size_t>(s.tokens * s.top_k);
  EXPECT_EQ(download<int32_t>(g.offsets, s.experts + 1), h.offsets) << what;
  EXPECT_EQ(download<int32_t>(g.error_count, 1)[0], h.errors) << what;
  EXPECT_EQ(download<int32_t>(g.slot_row, slots), h.slot_row) << what;
  const auto row_token = download<int32_t>(g.row_token, slots), row_expert = download<int32_t>(g.row_expert, slots);
  const auto row_weight = download<uint32_t>(g.row_weight, slots);
  int64_t mismatches = 0, touched = 0;
  for (size_t r = 0; r < slots; ++r) {
    if (r < static_cast<size_t>(h.total)) {
      uint32_t want_weight;
      std::memcpy(&want_weight, &h.row_weight[r], 4);
      mismatches += row_token[r] != h.row_token[r] || row_expert[r] != h.row_expert[r] || row_weight[r] != want_weight;
    } else {
      touched += row_token[r] != -1 || row_expert[r] != -1 || row_weight[r] != 0xFFFFFFFFu;
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": rows whose token, expert or weight differ from the host's";
  EXPECT_EQ(touched, 0) << what << ": rows past the " << h.total << " routed rows were written";
}

// ---- routing

TEST_F(CudaMoeRouting, RoutingMatchesHostOrder) {
  const std::vector<RouteShape> shapes = {
      {1, 8, 256, DType::I32, DType::F32},     {1, 8, 256, DType::I64, DType::BF16},
      {5, 6, 7, DType::I32, DType::F16},       {0, 8, 16, DType::I32, DType::F32},
      {300, 1, 3, DType::I32, DType::F32},     {333, 8, 64, DType::I64, DType::F32},
      {1100, 8, 1024, DType::I64, DType::F16}, {2500, 8, 256, DType::I32, DType::BF16},
      {16384, 8, 256, DType::I32, DType::BF16}, {129, 8, 1, DType::I64, DType::F32},
      {128, 8, 1024, DType::I32, DType::BF16},  {100, 8, 4, DType::I64, DType::F16},
  };
  // T·k ≤ 1024 runs the one-launch decode kernel, larger ones the chunked path (1032 slots: a tail chunk of 8)
  for (const auto& s : shapes) {
    const RouteInput in = make_route_input(s);
    const HostRouting h = host_route(in);
    GpuRouting g(in);
    g.route();
    synchronize(kGpu);
    expect_routing_matches(g, h, describe(s));
  }
}

// Every token routed to one expert in every slot: the deepest possible rank chains (in a warp, a chunk, and across
// chunks), on the one-launch path and the chunked one.
TEST_F(CudaMoeRouting, AllSlotsOneExpert) {
  for (int64_t tokens : {128, 3000}) {
    const RouteShape s{tokens, 8, 64, DType::I32, DType::F32};
    RouteInput in = make_route_input(s);
    for (int64_t i = 0; i < s.tokens * s.top_k; ++i) {
      in.index[i] = 5;
      in.index_buffer.ptr<int32_t>()[i] = 5;
    }
    const HostRouting h = host_route(in);
    GpuRouting g(in);
    g.route();
    synchronize(kGpu);
    expect_routing_matches(g, h, "all slots to expert 5, " + describe(s));
  }
}

// ---- permute + quantize

struct PermuteShape {
  int64_t tokens, hidden;
  int top_k, experts;
};

// Quantizes the gathered rows on the CPU reference; static: per expert segment with that expert's scale.
void reference_permute(const Buffer& hidden, const HostRouting& h, int64_t hidden_size,
                       const ActivationRecipe& recipe, const std::vector<float>& static_scales, Buffer& ref_q,
                       Buffer& ref_scale) {
  const DType dt = hidden.view.dtype;
  const size_t row_bytes = static_cast<size_t>(hidden_size) * dtype_size(dt);
  Buffer gathered(dt, {h.total, hidden_size});
  for (int32_t r = 0; r < h.total; ++r)
    std::memcpy(gathered.bytes.data() + r * row_bytes, hidden.bytes.data() + h.row_token[r] * row_bytes, row_bytes);
  ref_q = Buffer(DType::F8_E4M3, {h.total, hidden_size});
  if (!recipe.is_static()) {
    ref_scale = Buffer(DType::F32, activation_scale_shape(recipe, h.total, hidden_size));
    quantize_activations(gathered, recipe, ref_q, ref_scale, {Backend::Reference});
    return;
  }
  for (size_t e = 0; e + 1 < h.offsets.size(); ++e) {
    const int64_t begin = h.offsets[e], count = h.offsets[e + 1] - h.offsets[e];
    if (count == 0) continue;
    Buffer scale(DType::F32, {});
    *scale.ptr<float>() = static_scales[e];
    const auto x = TensorView::of(gathered.bytes.data() + begin * row_bytes, dt, {count, hidden_size});
    const auto q = TensorView::of(ref_q.bytes.data() + begin * hidden_size, DType::F8_E4M3, {count, hidden_size});
    quantize_activations(x, recipe, q, scale, {Backend::Reference});
  }
}

TEST_F(CudaMoeRouting, PermuteQuantizeBitExact) {
  const std::vector<ActivationRecipe> recipes = {
      ActivationRecipe::per_token_group(128), ActivationRecipe::per_token_group(128, true),
      ActivationRecipe::per_token_group(32),  ActivationRecipe::per_token_group(32, true),
      ActivationRecipe::per_token(),          ActivationRecipe::per_token(true),
      ActivationRecipe::static_per_tensor()};
  // 1, 2, 4 and 8 vectors per thread; H = 2880 (GPT-OSS) only for the 32-groups and row recipes.
  const std::vector<PermuteShape> shapes = {
      {1, 7168, 8, 256}, {37, 2048, 8, 128}, {60, 2880, 4, 128}, {64, 128, 6, 16}, {9, 16384, 2, 8}, {3, 32768, 8, 16},
  };
  for (DType hidden_dtype : {DType::BF16, DType::F32, DType::F16}) {
    for (const auto& shape : shapes) {
      const RouteShape rs{shape.tokens, shape.top_k, shape.experts, DType::I32, DType::F32};
      const RouteInput in = make_route_input(rs);
      const HostRouting h = host_route(in);
      GpuRouting g(in);
      g.route();
      const Buffer hidden = testing::random_tensor(hidden_dtype, {shape.tokens, shape.hidden});
      const DeviceBuffer d_hidden = upload(hidden);
      // Static scales: a calibration amax of 1 to 4, and one expert that saturates most of its values
      std::vector<float> static_scales(shape.experts);
      std::uniform_real_distribution<float> amax(1.0f, 4.0f);
      for (auto& s : static_scales) s = amax(testing::rng()) / 448.0f;
      static_scales[shape.experts - 1] = 0.05f / 448.0f;
      Buffer scales_buffer(DType::F32, {shape.experts});
      std::memcpy(scales_buffer.bytes.data(), static_scales.data(), static_scales.size() * 4);
      const DeviceBuffer d_static_scales = upload(scales_buffer);

      for (const auto& recipe : recipes) {
        if (recipe.granularity == ActGranularity::PerTokenGroup && shape.hidden % recipe.group_size != 0) continue;
        const std::string what = recipe.name() + " hidden=" + dtype_name(hidden_dtype) + " " + describe(rs) +
                                 " H=" + std::to_string(shape.hidden);
        const int64_t rows = shape.tokens * shape.top_k;
        const int64_t scales_per_row = recipe.granularity == ActGranularity::PerTokenGroup
                                           ? shape.hidden / recipe.group_size
                                           : 1;
        DeviceBuffer x_q = poisoned(static_cast<size_t>(rows * shape.hidden));
        DeviceBuffer x_scale = poisoned(static_cast<size_t>(rows * scales_per_row * 4));
        cuda::launch_moe_permute_quantize(d_hidden.data(), hidden_dtype, shape.tokens, shape.hidden, shape.top_k,
                                          g.view(), recipe, static_cast<const float*>(d_static_scales.data()),
                                          static_cast<uint8_t*>(x_q.data()),
                                          recipe.is_static() ? nullptr : static_cast<float*>(x_scale.data()), nullptr);
        synchronize(kGpu);
        const auto got_q = download_bytes(x_q), got_scale = download_bytes(x_scale);

        Buffer ref_q, ref_scale;
        reference_permute(hidden, h, shape.hidden, recipe, static_scales, ref_q, ref_scale);
        const size_t q_bytes = static_cast<size_t>(h.total * shape.hidden);
        int64_t code_mismatches = 0, codes_past_end = 0;
        for (size_t i = 0; i < got_q.size(); ++i) {
          if (i < q_bytes) code_mismatches += got_q[i] != ref_q.bytes[i];
          else codes_past_end += got_q[i] != 0xFF;
        }
        EXPECT_EQ(code_mismatches, 0) << what << ": E4M3 codes differ from the CPU reference";
        EXPECT_EQ(codes_past_end, 0) << what << ": x_q written past the routed rows";
        const size_t scale_bytes = recipe.is_static() ? 0 : static_cast<size_t>(h.total * scales_per_row * 4);
        int64_t scale_mismatches = 0, scales_past_end = 0;
        for (size_t i = 0; i < got_scale.size(); ++i) {
          if (i < scale_bytes) scale_mismatches += got_scale[i] != ref_scale.bytes[i];
          else scales_past_end += got_scale[i] != 0xFF;
        }
        EXPECT_EQ(scale_mismatches, 0) << what << ": scale bytes differ from the CPU reference";
        EXPECT_EQ(scales_past_end, 0) << what << ": x_scale written past the routed rows (or for a static recipe)";

        // The FP4 decode kernel's K order (perm_k, FINEGEMM_FP4_DECODE_PERM=1; groups of 128, per token or static, H a
        // multiple of 128): the same codes with each row's 128-blocks permuted (fp4_perm_k_logical), the same scales,
        // nothing past the routed rows.
        if (!cuda::quantize_perm_k_ok(recipe, shape.hidden)) continue;
        DeviceBuffer p_q = poisoned(static_cast<size_t>(rows * shape.hidden));
        DeviceBuffer p_scale = poisoned(static_cast<size_t>(rows * scales_per_row * 4));
        cuda::launch_moe_permute_quantize(d_hidden.data(), hidden_dtype, shape.tokens, shape.hidden, shape.top_k,
                                          g.view(), recipe, static_cast<const float*>(d_static_scales.data()),
                                          static_cast<uint8_t*>(p_q.data()),
                                          recipe.is_static() ? nullptr : static_cast<float*>(p_scale.data()), nullptr,
                                          false, true);
        synchronize(kGpu);
        const auto perm_q = download_bytes(p_q), perm_scale = download_bytes(p_scale);
        int64_t perm_mismatches = 0, perm_past_end = 0;
        for (size_t i = 0; i < perm_q.size(); ++i) {
          if (i < q_bytes) {
            perm_mismatches += perm_q[i / 128 * 128 + cuda::fp4_perm_k_logical(static_cast<int>(i % 128))] != ref_q.bytes[i];
          } else {
            perm_past_end += perm_q[i] != 0xFF;
          }
        }
        EXPECT_EQ(perm_mismatches, 0) << what << ": permuted codes differ from the CPU reference's, permuted";
        EXPECT_EQ(perm_past_end, 0) << what << ": permuted x_q written past the routed rows";
        EXPECT_TRUE(perm_scale == got_scale) << what << ": the permuted launch's scales differ";
      }
    }
  }
}

// ---- combine

// out[t] = Σ_j y[slot_row[t, j]] in fp32, slot order, rounded once to the output dtype.
Buffer host_combine(const Buffer& y, const HostRouting& h, int64_t tokens, int top_k, int64_t hidden, DType out_dtype) {
  Buffer out(out_dtype, {tokens, hidden});
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int32_t row = h.slot_row[t * top_k + j];
        if (row >= 0) acc += testing::get(y, row * hidden + c);
      }
      testing::set(out, t * hidden + c, acc);
    }
  }
  return out;
}

TEST_F(CudaMoeRouting, CombineMatchesHostSum) {
  const std::vector<PermuteShape> shapes = {{1, 7168, 8, 256}, {300, 2048, 8, 64}, {77, 512, 6, 7}, {5, 2880, 4, 3}};
  for (const auto& shape : shapes) {
    const RouteShape rs{shape.tokens, shape.top_k, shape.experts, DType::I64, DType::BF16};
    const RouteInput in = make_route_input(rs);
    const HostRouting h = host_route(in);
    GpuRouting g(in);
    g.route();
    const int64_t rows = shape.tokens * shape.top_k;
    for (DType y_dtype : {DType::F32, DType::BF16}) {
      // Rows past the routed ones are NaN: combine must never read them
      Buffer y = testing::random_tensor(y_dtype, {rows, shape.hidden});
      for (int64_t i = h.total * shape.hidden; i < rows * shape.hidden; ++i) testing::set(y, i, NAN);
      const DeviceBuffer d_y = upload(y);
      for (DType out_dtype : {DType::F32, DType::BF16, DType::F16}) {
        const std::string what = describe(rs) + " H=" + std::to_string(shape.hidden) + " y=" + dtype_name(y_dtype) +
                                 " out=" + dtype_name(out_dtype);
        const Buffer want = host_combine(y, h, shape.tokens, shape.top_k, shape.hidden, out_dtype);
        DeviceBuffer d_out = poisoned(static_cast<size_t>(shape.tokens * shape.hidden) * dtype_size(out_dtype));
        cuda::launch_moe_combine(d_y.data(), y_dtype, g.view(), shape.tokens, shape.top_k, shape.hidden, d_out.data(),
                                 out_dtype, nullptr);
        synchronize(kGpu);
        const auto got = download_bytes(d_out);
        int64_t mismatches = 0;
        for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want.bytes[i];
        EXPECT_EQ(mismatches, 0) << what << ": bytes differ from the host fp32 sum";
      }
    }
  }
}

// ---- determinism and graph capture

// Route, permute+quantize (group 128) and combine: returns every output's bytes.
struct PipelineOutputs {
  std::vector<uint8_t> offsets, slot_row, row_token, x_q, x_scale, out;
  bool operator==(const PipelineOutputs&) const = default;
};

TEST_F(CudaMoeRouting, DeterministicAndGraphCapturable) {
  const RouteShape rs{4096, 8, 256, DType::I32, DType::BF16};
  const int64_t hidden = 2048, rows = rs.tokens * rs.top_k;
  RouteInput in = make_route_input(rs);
  // Skew: half the slots go to experts 0..3, so long rank chains cross warps and chunks
  for (int64_t i = 0; i < rows; i += 2) {
    in.index[i] = (i / 2) % 4;
    in.index_buffer.ptr<int32_t>()[i] = static_cast<int32_t>(in.index[i]);
  }
  const HostRouting h = host_route(in);
  const ActivationRecipe recipe = ActivationRecipe::per_token_group(128);
  const Buffer x = testing::random_tensor(DType::BF16, {rs.tokens, hidden});
  const Buffer y = testing::random_tensor(DType::BF16, {rows, hidden});
  const DeviceBuffer d_x = upload(x), d_y = upload(y);

  auto run = [&](cudaStream_t stream, bool capture) {
    GpuRouting g(in);
    DeviceBuffer x_q = poisoned(static_cast<size_t>(rows * hidden)), x_scale = poisoned(rows * (hidden / 128) * 4);
    DeviceBuffer out = poisoned(static_cast<size_t>(rs.tokens * hidden) * 2);
    auto enqueue = [&] {
      g.route(stream);
      cuda::launch_moe_permute_quantize(d_x.data(), DType::BF16, rs.tokens, hidden, rs.top_k, g.view(), recipe,
                                        nullptr, static_cast<uint8_t*>(x_q.data()),
                                        static_cast<float*>(x_scale.data()), stream);
      cuda::launch_moe_combine(d_y.data(), DType::BF16, g.view(), rs.tokens, rs.top_k, hidden, out.data(),
                               DType::BF16, stream);
    };
    synchronize(kGpu);  // the uploads above ran on the legacy stream; `stream` does not wait for it
    if (capture) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      FG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      enqueue();
      FG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      FG_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      FG_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      FG_CUDA_CHECK(cudaStreamSynchronize(stream));
      FG_CUDA_CHECK(cudaGraphExecDestroy(exec));
      FG_CUDA_CHECK(cudaGraphDestroy(graph));
    } else {
      enqueue();
      FG_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    if (!capture) expect_routing_matches(g, h, "deterministic pipeline");
    return PipelineOutputs{download_bytes(g.offsets), download_bytes(g.slot_row), download_bytes(g.row_token),
                           download_bytes(x_q),       download_bytes(x_scale),    download_bytes(out)};
  };

  const PipelineOutputs first = run(nullptr, false);
  for (int i = 1; i < 10; ++i) EXPECT_TRUE(run(nullptr, false) == first) << "run " << i << " differs from run 0";
  cudaStream_t stream;
  FG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EXPECT_TRUE(run(stream, true) == first) << "the CUDA graph replay differs from the eager run";
  FG_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- argument checks (before any launch: they run without a GPU too)

// Runs f, which must throw finegemm::Error whose message mentions `needle` (so that a CUDA error, also a
// finegemm::Error, cannot pass for an argument check).
template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CudaMoeRoutingArgs, RejectsBadArguments) {
  int32_t dummy[4] = {};
  MoeRouting r{dummy, dummy, dummy, reinterpret_cast<float*>(dummy), dummy, dummy};
  uint8_t codes[16];
  float scales[4];
  using cuda::launch_moe_combine, cuda::launch_moe_permute_quantize, cuda::launch_moe_route;
  expect_error([&] { launch_moe_route(dummy, DType::I32, dummy, DType::F32, 4, 8, 2000, r, dummy, nullptr); },
               "num_experts");
  expect_error([&] { launch_moe_route(dummy, DType::F32, dummy, DType::F32, 4, 8, 16, r, dummy, nullptr); },
               "top_k_index");
  expect_error([&] { launch_moe_route(dummy, DType::I32, dummy, DType::I32, 4, 8, 16, r, dummy, nullptr); },
               "top_k_weights");
  expect_error([&] { launch_moe_route(dummy, DType::I32, dummy, DType::F32, 4, 0, 16, r, dummy, nullptr); }, "top_k");
  expect_error([&] { launch_moe_route(dummy, DType::I32, dummy, DType::F32, 4, 8, 16, MoeRouting{}, dummy, nullptr); },
               "routing.expert_offsets");
  expect_error([&] { launch_moe_route(dummy, DType::I32, dummy, DType::F32, 4, 8, 16, r, nullptr, nullptr); },
               "workspace");
  const auto group = ActivationRecipe::per_token_group(128);
  expect_error([&] { launch_moe_permute_quantize(dummy, DType::BF16, 4, 8, 8, r, group, nullptr, codes, scales, {}); },
               "multiple of 16");
  expect_error(
      [&] { launch_moe_permute_quantize(dummy, DType::BF16, 4, 2880, 8, r, group, nullptr, codes, scales, {}); },
      "multiple of the activation group 128");
  expect_error(
      [&] {
        launch_moe_permute_quantize(dummy, DType::BF16, 4, 2048, 8, r, ActivationRecipe::static_per_tensor(), nullptr,
                                    codes, nullptr, {});
      },
      "static_scales");
  expect_error([&] { launch_moe_permute_quantize(dummy, DType::I8, 4, 2048, 8, r, group, nullptr, codes, scales, {}); },
               "hidden: expected float32");
  // The FP4 decode kernel's permuted order needs whole 128-blocks and groups of 128.
  expect_error(
      [&] {
        launch_moe_permute_quantize(dummy, DType::BF16, 4, 2880, 8, r, ActivationRecipe::per_token(), nullptr, codes,
                                    scales, {}, false, true);
      },
      "permuted K");
  expect_error(
      [&] {
        launch_moe_permute_quantize(dummy, DType::BF16, 4, 2048, 8, r, ActivationRecipe::per_token_group(32), nullptr,
                                    codes, scales, {}, false, true);
      },
      "permuted K");
  expect_error([&] { launch_moe_combine(dummy, DType::I32, r, 4, 8, 2048, dummy, DType::BF16, {}); }, "y: expected");
  expect_error([&] { launch_moe_combine(dummy, DType::BF16, r, 4, 8, 2048, dummy, DType::F8_E4M3, {}); },
               "out: expected");
  expect_error([&] { launch_moe_combine(dummy, DType::BF16, r, 4, 8, 12, dummy, DType::BF16, {}); }, "multiple of 8");
}

}  // namespace
}  // namespace finegemm
