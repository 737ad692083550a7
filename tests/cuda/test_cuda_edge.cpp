// Edge cases of the CUDA backend, each against the CPU reference on fresh random data with poisoned outputs:
// K not a multiple of 128, an output view misaligned by one element, tensors on a device other than the current
// one, K = 0, the grouped GEMM called directly in its masked and contiguous layouts, and the MoE block with a
// no-gate activation at I ≡ 128 (mod 256) and with out-of-range routing indices. Skips itself when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "core/device_buffer.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"

namespace finegemm {
namespace {

using tools::DeviceRun;
using tools::HostTensor;

constexpr Device kGpu{DeviceType::CUDA, 0};

class CudaEdge : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::mt19937_64& rng() {
  static std::mt19937_64 gen(std::random_device{}());
  return gen;
}

NamedRecipe recipe_of(const WeightRecipe& weight, const ActivationRecipe& activation) {
  return {weight.name() + " x " + activation.name(), weight, activation};
}

// RECIPES.md: FP8×FP8 with bf16 output rel ≤ 3e-3, fp32 output rel ≤ 1e-3.
double tolerance(DType out) { return out == DType::F32 ? 1e-3 : 3e-3; }

// The reference output (F32) of host arguments.
HostTensor reference_linear(const LinearArgs& host_args) {
  HostTensor ref(DType::F32, {host_args.x.size(0), host_args.weight.size(0)});
  LinearArgs a = host_args;
  a.out = ref.view;
  linear(a, {Backend::Reference});
  return ref;
}

// Runs host arguments on the GPU: inputs copied in, the output poisoned first and copied back.
HostTensor run_linear_on_gpu(const LinearArgs& host_args) {
  HostTensor out(host_args.out.dtype, host_args.out.sizes());
  tools::poison(out.view);
  LinearArgs with_out = host_args;
  with_out.out = out.view;
  DeviceRun gpu(Backend::Cuda);
  LinearArgs args = gpu.upload(with_out);
  linear(args, {Backend::Cuda});
  gpu.download(args.out, out.view);
  return out;
}

std::string describe(const NamedRecipe& recipe, int64_t m, int64_t n, int64_t k, DType out) {
  return recipe.name + " M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
         " out=" + dtype_name(out);
}

// ---------------------------------------------------------------------------------------------------------------
// 1. K not a multiple of 128: the last K block is partial (zero-filled by TMA), for recipes without promotion
//    (per-tensor, per-channel), with 32-wide promotion (block 32x32) and FP4 weights (MX 1x32, packed rows of K/2
//    bytes that are not a multiple of the 64-byte box).
TEST_F(CudaEdge, LinearKNotMultipleOf128) {
  struct Case {
    NamedRecipe recipe;
    std::vector<int64_t> ks;
  };
  // NOTE: block 32x32 takes group-32 activations, so K must be a multiple of 32: 352 (= 2·128 + 96) stands in for 336.
  const Case cases[] = {
      {recipe_of(WeightRecipe::per_tensor(), ActivationRecipe::static_per_tensor()), {96, 160, 336}},
      {recipe_of(WeightRecipe::per_tensor(), ActivationRecipe::per_token()), {96, 160, 336}},
      {recipe_of(WeightRecipe::per_channel(), ActivationRecipe::per_token()), {96, 160, 336}},
      {recipe_of(WeightRecipe::block(32, 32), ActivationRecipe::per_token_group(32)), {96, 160, 352}},
      {recipe_of(WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token_group(32)), {384 + 32}},
  };
  for (const Case& c : cases) {
    for (int64_t k : c.ks) {
      for (int64_t m : {1, 70}) {
        for (int64_t n : {48, 400}) {
          for (DType out_dtype : {DType::BF16, DType::F32}) {
            const tools::LinearData data = tools::make_linear(rng(), c.recipe, {m, n, k, m == 70, out_dtype});
            const LinearArgs host_args = data.args(data.out.view);
            const HostTensor ref = reference_linear(host_args);
            const HostTensor got = run_linear_on_gpu(host_args);
            const auto cmp = tools::compare(got.view, ref.view);
            EXPECT_TRUE(cmp.ok(tolerance(out_dtype)))
                << describe(c.recipe, m, n, k, out_dtype) << " rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 2. An output view that starts one element into its allocation (not aligned for the kernel's paired stores):
//    the right answer (by the host path), and the guard elements before and after the view left alone.
TEST_F(CudaEdge, LinearOutMisalignedByOneElement) {
  const NamedRecipe recipe = recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128));
  const int64_t n = 400, k = 512;
  for (int64_t m : {1, 70}) {
    for (DType out_dtype : {DType::BF16, DType::F32}) {
      const tools::LinearData data = tools::make_linear(rng(), recipe, {m, n, k, true, out_dtype});
      const LinearArgs host_args = data.args(data.out.view);
      const HostTensor ref = reference_linear(host_args);

      const size_t element = dtype_size(out_dtype), bytes = static_cast<size_t>(m * n + 2) * element;
      HostTensor poisoned(out_dtype, {m * n + 2});
      tools::poison(poisoned.view);
      DeviceBuffer out_buffer(kGpu, bytes);
      out_buffer.copy_from_host(poisoned.bytes.data(), bytes);

      DeviceRun gpu(Backend::Cuda);
      LinearArgs args = gpu.upload(host_args);
      args.out = TensorView::of(static_cast<uint8_t*>(out_buffer.data()) + element, out_dtype, {m, n}, kGpu);
      ASSERT_NO_THROW(linear(args, {Backend::Cuda})) << describe(recipe, m, n, k, out_dtype);
      synchronize(kGpu);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);

      HostTensor back(out_dtype, {m * n + 2});
      out_buffer.copy_to_host(back.bytes.data(), bytes);
      EXPECT_EQ(0, std::memcmp(back.bytes.data(), poisoned.bytes.data(), element))
          << "the element before the view was written: " << describe(recipe, m, n, k, out_dtype);
      EXPECT_EQ(0, std::memcmp(back.bytes.data() + bytes - element, poisoned.bytes.data() + bytes - element, element))
          << "the element after the view was written: " << describe(recipe, m, n, k, out_dtype);
      const TensorView got = TensorView::of(back.bytes.data() + element, out_dtype, {m, n});
      const auto cmp = tools::compare(got, ref.view);
      EXPECT_TRUE(cmp.ok(tolerance(out_dtype)))
          << describe(recipe, m, n, k, out_dtype) << " rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 3. Every tensor on device 1 while device 0 is current: the op runs on the tensors' device and leaves device 0
//    current.
TEST_F(CudaEdge, LinearOnDeviceOneWhileZeroIsCurrent) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "one CUDA device: nothing to test";
  const Device other{DeviceType::CUDA, 1};
  for (const NamedRecipe& recipe : {recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128)),
                                    recipe_of(WeightRecipe::per_channel(), ActivationRecipe::per_token()),
                                    recipe_of(WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token_group(32))}) {
    const int64_t m = 70, n = 400, k = 1024;
    const tools::LinearData data = tools::make_linear(rng(), recipe, {m, n, k, true, DType::BF16});
    const LinearArgs host_args = data.args(data.out.view);
    const HostTensor ref = reference_linear(host_args);
    HostTensor out(DType::BF16, {m, n});
    tools::poison(out.view);
    {
      // NOTE: DeviceBuffer allocates on the current device: make device 1 current for the copies (and the frees).
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      std::vector<DeviceTensor> held;
      auto put = [&](const TensorView& t) {
        if (!t.defined()) return t;
        held.push_back(to_device(t, other));
        return held.back().view;
      };
      LinearArgs args = host_args;
      args.x = put(host_args.x);
      args.x_scale = put(host_args.x_scale);
      args.weight = put(host_args.weight);
      args.weight_scale = put(host_args.weight_scale);
      args.bias = put(host_args.bias);
      args.out = put(out.view);
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

      ASSERT_NO_THROW(linear(args, {Backend::Cuda})) << recipe.name;
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, 0) << "linear changed the current device: " << recipe.name;

      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      copy_to_host(args.out, out.view);
      held.clear();
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    }
    const auto cmp = tools::compare(out.view, ref.view);
    EXPECT_TRUE(cmp.ok(3e-3)) << recipe.name << " on device 1: rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 4. K = 0 (x [M, 0], weight [N, 0]): the empty sum, so the output is the bias, or zeros.
TEST_F(CudaEdge, LinearKZeroGivesBiasOrZeros) {
  const int64_t n = 400;
  for (const NamedRecipe& recipe : {recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128)),
                                    recipe_of(WeightRecipe::per_tensor(), ActivationRecipe::static_per_tensor()),
                                    recipe_of(WeightRecipe::per_channel(), ActivationRecipe::per_token())}) {
    for (int64_t m : {1, 70}) {
      for (bool with_bias : {false, true}) {
        for (DType out_dtype : {DType::BF16, DType::F32}) {
          HostTensor x(DType::BF16, {m, 0}), weight(DType::F8_E4M3, {n, 0});
          HostTensor weight_scale(weight_scale_dtype(recipe.weight), weight_scale_shape(recipe.weight, n, 0));
          for (int64_t i = 0; i < weight_scale.numel(); ++i) weight_scale.ptr<float>()[i] = 0.5f;  // none for block
          HostTensor x_scale, bias;
          if (recipe.activation.is_static()) {
            x_scale = HostTensor(DType::F32, {});
            *x_scale.ptr<float>() = 0.01f;
          }
          if (with_bias) bias = tools::random_normal(rng(), DType::F32, {n}, 1.0f);
          HostTensor out_shape(out_dtype, {m, n});
          LinearArgs host_args;
          host_args.x = x.view;
          host_args.x_scale = x_scale.view;
          host_args.activation = recipe.activation;
          host_args.weight = weight.view;
          host_args.weight_scale = weight_scale.view;
          host_args.weight_recipe = recipe.weight;
          host_args.bias = bias.view;
          host_args.out = out_shape.view;

          HostTensor got;
          ASSERT_NO_THROW(got = run_linear_on_gpu(host_args)) << describe(recipe, m, n, 0, out_dtype);
          int64_t wrong = 0;
          for (int64_t i = 0; i < m * n; ++i) {
            const float v = tools::read_float(got.view, i);
            const float expected = with_bias ? bias.ptr<float>()[i % n] : 0.0f;
            // bf16 rounding of the bias: at most half an ulp, 2^-9 relative.
            const float allowed = out_dtype == DType::F32 ? 0.0f : std::fabs(expected) * 0x1p-8f;
            if (!(std::fabs(v - expected) <= allowed)) ++wrong;
          }
          EXPECT_EQ(wrong, 0) << describe(recipe, m, n, 0, out_dtype) << (with_bias ? " +bias" : " no bias")
                              << ": elements that are not the " << (with_bias ? "bias" : "zero");
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 5. The grouped GEMM (Epilogue::Store) called directly: A E4M3 rows with group-128 scales, B [E, N, K] E4M3 with
//    block 128x128 FP32 scales.
struct GroupedData {
  int64_t experts = 0, n = 0, k = 0;
  HostTensor a, a_scale;   // [rows, K] E4M3, [rows, K/128] F32
  tools::QuantizedWeight b;  // [E, N, K] E4M3, [E, N/128, K/128] F32
};

GroupedData make_grouped(int64_t rows, int64_t experts, int64_t n, int64_t k) {
  GroupedData g;
  g.experts = experts;
  g.n = n;
  g.k = k;
  const HostTensor x = tools::random_normal(rng(), DType::BF16, {rows, k}, 1.0f);
  g.a = HostTensor(DType::F8_E4M3, {rows, k});
  g.a_scale = HostTensor(DType::F32, {rows, k / 128});
  quantize_activations(x.view, ActivationRecipe::per_token_group(128), g.a.view, g.a_scale.view);
  const HostTensor master = tools::random_normal(rng(), DType::F32, {experts, n, k}, 1.0f / std::sqrt(float(k)));
  g.b = tools::quantize(master.view, WeightRecipe::block());
  return g;
}

// Rows nobody should read into a valid output: NaN codes and NaN scales (what an unfilled buffer may hold).
void poison_rows(GroupedData& g, int64_t row0, int64_t rows) {
  std::memset(g.a.bytes.data() + row0 * g.k, 0x7F, static_cast<size_t>(rows * g.k));
  for (int64_t i = row0 * (g.k / 128); i < (row0 + rows) * (g.k / 128); ++i) g.a_scale.ptr<float>()[i] = NAN;
}

// The parameters moe.cu builds for a down projection (set_activation with group-128 scales, set_weight with
// block 128x128 FP32 scales), with no bias and no routing weight.
cuda::GemmParams store_params(int64_t rows, int64_t n, int64_t k, const float* a_scale, const void* b_scale, void* out,
                              DType out_dtype) {
  cuda::GemmParams p;
  p.m = static_cast<int>(rows);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.promote_k = 128;
  p.b_fp4 = false;
  p.a_scale = a_scale;
  p.a_scale_stride_m = k / 128;
  p.a_scale_stride_k = 1;
  p.a_group = 128;
  p.a_scale_cols = static_cast<int>(k / 128);
  const auto shape = weight_scale_shape(WeightRecipe::block(), n, k);
  p.b_scale = b_scale;
  p.b_scale_fmt = cuda::ScaleFmt::F32;
  p.b_scale_stride_n = shape[1];
  p.b_scale_group_stride = shape[0] * shape[1];
  p.b_block_n = 128;
  p.b_block_k = 128;
  p.b_scale_cols = static_cast<int>(k / 128);
  p.b_layout = cuda::BLayout::Plain;
  p.out = out;
  p.out_dtype = out_dtype == DType::F32 ? cuda::OutDType::F32 : cuda::OutDType::BF16;
  p.ldo = n;
  return p;
}

// Runs the grouped GEMM over all of g.a's rows into a poisoned [rows, N] output. `groups`: offsets [E + 1]
// (contiguous) or counts [E] (masked, with max_rows).
HostTensor run_grouped(const GroupedData& g, const std::vector<int32_t>& groups, bool masked, int max_rows,
                       int64_t expected_rows_per_group, DType out_dtype) {
  const int64_t rows = g.a.view.size(0);
  HostTensor out(out_dtype, {rows, g.n});
  tools::poison(out.view);
  const DeviceTensor a = to_device(g.a.view, kGpu), a_scale = to_device(g.a_scale.view, kGpu),
                     b = to_device(g.b.weight.view, kGpu), b_scale = to_device(g.b.scale.view, kGpu),
                     d_out = to_device(out.view, kGpu),
                     d_groups = to_device(TensorView::of(groups.data(), DType::I32, {static_cast<int64_t>(groups.size())}), kGpu);
  cuda::GroupedLayout layout;
  if (masked) {
    layout.counts = d_groups.view.ptr<const int32_t>();
    layout.max_rows = max_rows;
  } else {
    layout.offsets = d_groups.view.ptr<const int32_t>();
  }
  layout.num_groups = static_cast<int>(g.experts);
  layout.expected_rows_per_group = expected_rows_per_group;
  const cuda::GemmParams p = store_params(rows, g.n, g.k, a_scale.view.ptr<const float>(), b_scale.view.data,
                                          d_out.view.data, out_dtype);
  cuda::launch_sm90_fp8_grouped_gemm(a.view.data, g.k, b.view.data, g.k, layout, cuda::Epilogue::Store, p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  copy_to_host(d_out.view, out.view);
  return out;
}

// Reference (F32) of expert e on rows [row0, row0 + count): a plain linear on that expert's slices.
HostTensor expert_reference(const GroupedData& g, int64_t e, int64_t row0, int64_t count) {
  const auto scale_shape = weight_scale_shape(WeightRecipe::block(), g.n, g.k);
  LinearArgs a;
  a.x = TensorView::of(g.a.bytes.data() + row0 * g.k, DType::F8_E4M3, {count, g.k});
  a.x_scale = TensorView::of(g.a_scale.ptr<float>() + row0 * (g.k / 128), DType::F32, {count, g.k / 128});
  a.activation = ActivationRecipe::per_token_group(128);
  a.weight = TensorView::of(g.b.weight.bytes.data() + e * g.n * g.k, DType::F8_E4M3, {g.n, g.k});
  a.weight_scale = TensorView::of(g.b.scale.ptr<float>() + e * scale_shape[0] * scale_shape[1], DType::F32, scale_shape);
  a.weight_recipe = WeightRecipe::block();
  HostTensor ref(DType::F32, {count, g.n});
  a.out = ref.view;
  linear(a, {Backend::Reference});
  return ref;
}

// Rows [row0, row0 + rows) of out still hold the poison, byte for byte.
bool rows_untouched(const HostTensor& out, int64_t row0, int64_t rows) {
  HostTensor poisoned(out.view.dtype, {rows, out.view.size(1)});
  tools::poison(poisoned.view);
  const size_t row_bytes = static_cast<size_t>(out.view.size(1)) * dtype_size(out.view.dtype);
  return std::memcmp(out.bytes.data() + row0 * row_bytes, poisoned.bytes.data(), rows * row_bytes) == 0;
}

// Compares expert e's rows [row0, row0 + count) of out with the reference.
void expect_expert_rows(const GroupedData& g, const HostTensor& out, int64_t e, int64_t row0, int64_t count,
                        const std::string& what) {
  if (count == 0) return;
  const HostTensor ref = expert_reference(g, e, row0, count);
  const size_t row_bytes = static_cast<size_t>(g.n) * dtype_size(out.view.dtype);
  const TensorView got = TensorView::of(out.bytes.data() + row0 * row_bytes, out.view.dtype, {count, g.n});
  const auto cmp = tools::compare(got, ref.view);
  EXPECT_TRUE(cmp.ok(tolerance(out.view.dtype))) << what << " expert " << e << " (" << count << " rows): rel=" << cmp.rel
                                                 << " non-finite=" << cmp.non_finite;
}

// Masked layout: expert e owns rows [e·max_rows, e·max_rows + counts[e]); the rest of its rows are never written.
TEST_F(CudaEdge, GroupedGemmMaskedLayout) {
  const int64_t n = 256, k = 512, max_rows = 150;
  const std::vector<int32_t> counts = {0, 150, 1, 77, 128, 129, 64, 65};  // 0 and max_rows included
  const int64_t experts = static_cast<int64_t>(counts.size());
  GroupedData g = make_grouped(experts * max_rows, experts, n, k);
  for (int64_t e = 0; e < experts; ++e) poison_rows(g, e * max_rows + counts[e], max_rows - counts[e]);
  // Small and large expected rows: 64-row and 128-row tiles.
  for (int64_t expected : {16, 150}) {
    for (DType out_dtype : {DType::BF16, DType::F32}) {
      const std::string what = std::string("masked, expected rows ") + std::to_string(expected) + ", out " + dtype_name(out_dtype);
      const HostTensor out = run_grouped(g, counts, true, static_cast<int>(max_rows), expected, out_dtype);
      for (int64_t e = 0; e < experts; ++e) {
        expect_expert_rows(g, out, e, e * max_rows, counts[e], what);
        EXPECT_TRUE(rows_untouched(out, e * max_rows + counts[e], max_rows - counts[e]))
            << what << ": rows past counts[" << e << "] = " << counts[e] << " were written";
      }
    }
  }
}

// Contiguous layout: expert e owns rows [offsets[e], offsets[e+1]); the first and last experts are empty, one has
// more than 3·128 rows; rows past offsets[E] (scratch in moe.cu) are never written. 40 experts × 16 column blocks
// give far more tiles than SMs: each persistent CTA walks several tiles (and several experts).
TEST_F(CudaEdge, GroupedGemmContiguousLayoutManyTiles) {
  const int64_t experts = 40, n = 2048, k = 256, tail_rows = 19;
  std::vector<int32_t> counts(experts);
  std::uniform_int_distribution<int32_t> rows_dist(1, 40);
  for (auto& c : counts) c = rows_dist(rng());
  counts[0] = 0;
  counts[experts - 1] = 0;
  counts[17] = 3 * 128 + 33;
  std::vector<int32_t> offsets(experts + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t routed = offsets[experts];
  GroupedData g = make_grouped(routed + tail_rows, experts, n, k);
  poison_rows(g, routed, tail_rows);
  std::vector<HostTensor> refs;
  for (int64_t e = 0; e < experts; ++e)
    refs.push_back(counts[e] ? expert_reference(g, e, offsets[e], counts[e]) : HostTensor());
  for (int64_t expected : {16, 128}) {
    for (DType out_dtype : {DType::BF16, DType::F32}) {
      const std::string what = std::string("contiguous, expected rows ") + std::to_string(expected) + ", out " + dtype_name(out_dtype);
      const HostTensor out = run_grouped(g, offsets, false, 0, expected, out_dtype);
      const size_t row_bytes = static_cast<size_t>(n) * dtype_size(out_dtype);
      for (int64_t e = 0; e < experts; ++e) {
        if (counts[e] == 0) continue;
        const TensorView got = TensorView::of(out.bytes.data() + offsets[e] * row_bytes, out_dtype, {counts[e], n});
        const auto cmp = tools::compare(got, refs[e].view);
        EXPECT_TRUE(cmp.ok(tolerance(out_dtype)))
            << what << " expert " << e << " (" << counts[e] << " rows): rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
      }
      EXPECT_TRUE(rows_untouched(out, routed, tail_rows)) << what << ": rows past offsets[E] were written";
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// 6. The MoE block.
tools::Comparison moe_against_reference(const MoeArgs& gpu_host_args, const MoeArgs& ref_host_args, DType out_dtype) {
  const int64_t tokens = gpu_host_args.hidden.size(0), hidden = gpu_host_args.hidden.size(1);
  HostTensor ref(out_dtype, {tokens, hidden});
  MoeArgs ref_args = ref_host_args;
  ref_args.out = ref.view;
  moe_experts(ref_args, {Backend::Reference});
  HostTensor out(out_dtype, {tokens, hidden});
  tools::poison(out.view);
  MoeArgs with_out = gpu_host_args;
  with_out.out = out.view;
  DeviceRun gpu(Backend::Cuda);
  MoeArgs args = gpu.upload(with_out);
  moe_experts(args, {Backend::Cuda});
  gpu.download(args.out, out.view);
  return tools::compare(out.view, ref.view);
}

// A no-gate activation with I = 384: the fused gate_up tile is 256 columns wide, so its second column block is
// half empty (I ≡ 128 mod 256); with a gate_up bias, for recipes the grouped GPU path serves.
TEST_F(CudaEdge, MoeNoGateActivationITailWithBias) {
  for (const NamedRecipe& recipe : {recipe_of(WeightRecipe::block(), ActivationRecipe::static_per_tensor()),
                                    recipe_of(WeightRecipe::per_tensor(), ActivationRecipe::static_per_tensor()),
                                    recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128))}) {
    for (int64_t tokens : {40, 200}) {
      tools::MoeProblem problem;
      problem.tokens = tokens;
      problem.hidden = 256;
      problem.inter = 384;
      problem.experts = 8;
      problem.top_k = 4;
      problem.activation = MoeActivation::Silu;
      problem.bias = true;
      const auto masters = tools::make_moe_masters(rng(), problem);
      const tools::MoeData data = tools::make_moe(rng(), recipe, problem, masters);
      const MoeArgs args = data.args(TensorView{});
      const auto cmp = moe_against_reference(args, args, problem.out_dtype);
      EXPECT_TRUE(cmp.ok(1e-2)) << recipe.name << " T=" << tokens << " " << problem.variant() << " I=384: rel="
                                << cmp.rel << " non-finite=" << cmp.non_finite;
    }
  }
}

// top_k_index on the GPU holding experts outside [0, E) (≥ E, negative other than -1; for int64, values that would
// wrap into a valid expert if cut to 32 bits): skipped like -1. One token has only such entries.
TEST_F(CudaEdge, MoeOutOfRangeExpertIndicesAreSkipped) {
  const NamedRecipe recipe = recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128));
  tools::MoeProblem problem;
  problem.tokens = 100;
  problem.hidden = 256;
  problem.inter = 256;
  problem.experts = 8;
  problem.top_k = 4;
  const auto masters = tools::make_moe_masters(rng(), problem);
  const tools::MoeData data = tools::make_moe(rng(), recipe, problem, masters);
  const int64_t slots = problem.tokens * problem.top_k;
  const int32_t* routed = data.top_k_index.ptr<int32_t>();
  ASSERT_EQ(data.top_k_index.view.dtype, DType::I32);
  const int64_t bad32[] = {8, 9, 1000, -2, INT32_MIN, INT32_MAX};
  const int64_t bad64[] = {8, (int64_t(1) << 32), (int64_t(1) << 32) + 3, -2, -(int64_t(1) << 32) + 1, INT64_MAX};
  for (DType index_dtype : {DType::I32, DType::I64}) {
    HostTensor gpu_index(index_dtype, {problem.tokens, problem.top_k}), ref_index(DType::I32, {problem.tokens, problem.top_k});
    int64_t replaced = 0;
    for (int64_t i = 0; i < slots; ++i) {
      const bool bad = i < problem.top_k || i % 5 == 2;  // token 0: every slot
      const int64_t value = bad ? (index_dtype == DType::I32 ? bad32 : bad64)[i % 6] : routed[i];
      replaced += bad;
      ref_index.ptr<int32_t>()[i] = bad ? -1 : routed[i];
      if (index_dtype == DType::I32) gpu_index.ptr<int32_t>()[i] = static_cast<int32_t>(value);
      else gpu_index.ptr<int64_t>()[i] = value;
    }
    MoeArgs gpu_args = data.args(TensorView{}), ref_args = gpu_args;
    gpu_args.top_k_index = gpu_index.view;
    ref_args.top_k_index = ref_index.view;
    const auto cmp = moe_against_reference(gpu_args, ref_args, problem.out_dtype);
    EXPECT_TRUE(cmp.ok(1e-2)) << dtype_name(index_dtype) << " index, " << replaced
                              << " out-of-range slots: rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
  }
}

}  // namespace
}  // namespace finegemm
