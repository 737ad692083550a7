// Edge cases of the CUDA backend, each against the CPU reference on fresh random data with poisoned outputs:
// K not a multiple of 128, an output view misaligned by one element, tensors on a device other than the current
// one, K = 0, the grouped GEMM called directly in its masked and contiguous layouts (FP8 experts, and FP4 experts
// with MX scales: fold and promote-per-32 kernels, exact one-hot rows), and the MoE block with a
// no-gate activation at I ≡ 128 (mod 256) and with out-of-range routing indices. Skips itself when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "cluster_ring_probe.hpp"
#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"
#include "testing.hpp"

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

using testing::rng;  // seeded by FINEGEMM_TEST_SEED or fresh, printed (testing.hpp)

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
// The scratch pool: linear calls that take scratch (activation quantization), then release_cached_memory(), then
// the same calls again: within tolerance of the reference and the same bits. The pool holds memory before the
// release and none after it.
TEST_F(CudaEdge, ReleaseCachedMemoryBetweenCalls) {
  const NamedRecipe recipe = recipe_of(WeightRecipe::block(), ActivationRecipe::per_token_group(128));
  const char* pool_env = std::getenv("FINEGEMM_SCRATCH_POOL");
  const bool own_pool = !(pool_env && std::string(pool_env) == "default");
  for (int64_t m : {1, 300}) {
    const tools::LinearData data = tools::make_linear(rng(), recipe, {m, 512, 4096, false, DType::BF16});
    const LinearArgs host_args = data.args(data.out.view);
    const HostTensor ref = reference_linear(host_args);
    const HostTensor first = run_linear_on_gpu(host_args);
    ASSERT_TRUE(cuda::scratch_pool_created(0));
    uint64_t reserved = 0;
    ASSERT_EQ(cudaMemPoolGetAttribute(cuda::scratch_pool(0), cudaMemPoolAttrReservedMemCurrent, &reserved), cudaSuccess);
    if (own_pool) EXPECT_GT(reserved, 0u) << "M=" << m << ": the pool kept nothing of the call's scratch";
    release_cached_memory(0);
    ASSERT_EQ(cudaMemPoolGetAttribute(cuda::scratch_pool(0), cudaMemPoolAttrReservedMemCurrent, &reserved), cudaSuccess);
    EXPECT_EQ(reserved, 0u) << "M=" << m << ": memory left in the pool after release_cached_memory";
    const HostTensor second = run_linear_on_gpu(host_args);
    const auto cmp = tools::compare(first.view, ref.view);
    EXPECT_TRUE(cmp.ok(tolerance(DType::BF16))) << describe(recipe, m, 512, 4096, DType::BF16) << " rel=" << cmp.rel;
    EXPECT_EQ(0, std::memcmp(first.view.data, second.view.data,
                             static_cast<size_t>(first.view.numel()) * dtype_size(first.view.dtype)))
        << "M=" << m;
  }
  EXPECT_THROW(release_cached_memory(-1), Error);
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
//    block 128x128 FP32 scales; and (5b below) FP4 experts, B [E, N, K/2] packed E2M1 with MX 1x32 scales.
struct GroupedData {
  int64_t experts = 0, n = 0, k = 0;
  int a_group = 128;                            // A's scale group along K
  WeightRecipe recipe = WeightRecipe::block();  // B's recipe: block 128x128 FP32, or MX (FP4)
  HostTensor a, a_scale;     // [rows, K] E4M3, [rows, K/a_group] F32
  tools::QuantizedWeight b;  // [E, N, K] E4M3, [E, N/128, K/128] F32; FP4: [E, N, K/2] U8, [E, <MX scale shape>]
  // FP4 only: the scale exponent of each 1x32 group [E, N, K/32], and per A row the column of its single nonzero
  // element (-1: a random row).
  std::vector<int> b_exp;
  std::vector<int64_t> one_hot_col;
  bool fp4() const { return recipe.element == ElementType::FP4_E2M1; }
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
  const int64_t groups = g.k / g.a_group;
  std::memset(g.a.bytes.data() + row0 * g.k, 0x7F, static_cast<size_t>(rows * g.k));
  for (int64_t i = row0 * groups; i < (row0 + rows) * groups; ++i) g.a_scale.ptr<float>()[i] = NAN;
}

// The parameters moe.cu builds for a down projection (set_activation_scales with per-token-group scales,
// set_weight_scales with g's recipe: block 128x128 FP32, or MX 1x32), with no bias and no routing weight.
cuda::GemmParams store_params(const GroupedData& g, int64_t rows, const float* a_scale, const TensorView& b_scale,
                              void* out, DType out_dtype) {
  const ActivationRecipe act = ActivationRecipe::per_token_group(g.a_group);
  cuda::GemmParams p;
  p.m = static_cast<int>(rows);
  p.n = static_cast<int>(g.n);
  p.k = static_cast<int>(g.k);
  p.promote_k = cuda::promotion_k(g.recipe, act);
  p.b_fp4 = g.fp4();
  cuda::set_activation_scales(p, act, a_scale, g.k / g.a_group, 1, g.k, nullptr);
  cuda::set_weight_scales(p, g.recipe, b_scale, g.n, g.k);
  p.b_layout = cuda::BLayout::Plain;
  p.out = out;
  p.out_dtype = out_dtype == DType::F32 ? cuda::OutDType::F32 : cuda::OutDType::BF16;
  p.ldo = g.n;
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
  const cuda::GemmParams p = store_params(g, rows, a_scale.view.ptr<const float>(), b_scale.view, d_out.view.data,
                                          out_dtype);
  const int64_t ldb = g.b.weight.view.size(-1);  // bytes per B row: K (E4M3) or K/2 (packed E2M1)
  cuda::launch_sm90_fp8_grouped_gemm(a.view.data, g.k, b.view.data, ldb, layout, cuda::Epilogue::Store, p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  copy_to_host(d_out.view, out.view);
  return out;
}

// Reference (F32) of expert e on rows [row0, row0 + count): a plain linear on that expert's slices (FP8 B).
HostTensor expert_reference(const GroupedData& g, int64_t e, int64_t row0, int64_t count) {
  EXPECT_FALSE(g.fp4()) << "expert_reference takes FP8 experts; FP4 ones have fp4_reference";
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
// 5b. The grouped GEMM with FP4 experts (issue 5): B [E, N, K/2] packed E2M1 (low nibble first) with MX 1x32 scales
//     [E, N, K/32] (UE8M0 bytes, packed UE8M0 words or FP32), in both layouts, against a reference dequantized here
//     with formats.hpp from the very bytes the kernel reads. UE8M0 bytes with group-128 A run the fold kernels: a
//     K block's 1x32 power-of-two scales are folded into the expanded E4M3 values when every row of the 128-row B
//     tile spreads ≤ 8 binades there, else that block is expanded unfolded and promoted every 32. Every other case
//     runs the promote-per-32 kernel.
//     A third of A's rows are one-hot (one nonzero E4M3 element): such an output is a single product, exact in fp32
//     and bf16, and is compared bit for bit: a block folded though it spreads > 8 (small codes lost below E4M3's
//     subnormals), a wrong shift, scale or expert shows up there. The random rows are held to RECIPES.md's bars.

// How an expert's scale exponents spread within each 128-wide K block.
enum class Spreads { Fold, Wide, Mixed };  // every row ≤ 8; every row > 8; per (128-row tile, block) a mix

const char* spreads_name(Spreads s) { return s == Spreads::Fold ? "fold" : (s == Spreads::Wide ? "wide" : "mixed"); }

int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng()); }

int64_t mx_groups(const GroupedData& g) { return g.k / 32; }
int b_exp(const GroupedData& g, int64_t e, int64_t row, int64_t group) {
  return g.b_exp[static_cast<size_t>((e * g.n + row) * mx_groups(g) + group)];
}
// max − min of the exponents of expert e's row in K block `block`, and the largest.
int spread_of(const GroupedData& g, int64_t e, int64_t row, int64_t block) {
  const auto first = g.b_exp.begin() + (e * g.n + row) * mx_groups(g) + block * 4;
  const auto [lo, hi] = std::minmax_element(first, first + 4);
  return *hi - *lo;
}
int block_max_exp(const GroupedData& g, int64_t e, int64_t row, int64_t block) {
  const auto first = g.b_exp.begin() + (e * g.n + row) * mx_groups(g) + block * 4;
  return *std::max_element(first, first + 4);
}
// The kernel's fold decision: a (B tile of 128 rows, K block) folds when every row of the tile spreads ≤ 8.
bool tile_folds(const GroupedData& g, int64_t e, int64_t row, int64_t block) {
  const int64_t r0 = row / 128 * 128, r1 = std::min(g.n, r0 + 128);
  for (int64_t r = r0; r < r1; ++r)
    if (spread_of(g, e, r, block) > 8) return false;
  return true;
}

// FP4 experts and A rows. K must be a multiple of 128 (group-128 A). `rows` A rows with per-token-group (a_group)
// power-of-two scales; every third row (row % 3 == 1) is one-hot. Expert e's exponents follow spreads[e]: a row's
// top exponent in [-6, 2], ±1 per block; its four groups in [top − spread, top] with both ends taken; spread 0..8
// (fold) or 9..20 (wide); Mixed: per (128-row tile, block), (tile + block + e) % 3 picks all fold, all wide, or one
// wide row among folding ones. FP32 scales get mantissas in [1, 2).
GroupedData make_grouped_fp4(int64_t rows, int64_t n, int64_t k, int a_group, ScaleFormat format,
                             const std::vector<Spreads>& spreads) {
  GroupedData g;
  g.experts = static_cast<int64_t>(spreads.size());
  g.n = n;
  g.k = k;
  g.a_group = a_group;
  g.recipe = WeightRecipe::mxfp4(format);
  const int64_t experts = g.experts, groups = k / 32;

  // Exponents.
  g.b_exp.assign(static_cast<size_t>(experts * n * groups), 0);
  const int64_t tiles = (n + 127) / 128, blocks = k / 128;
  for (int64_t e = 0; e < experts; ++e) {
    // Mixed: the one wide row of each (tile, block) pair of kind 2.
    std::vector<int64_t> wide_row(static_cast<size_t>(tiles * blocks));
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t b = 0; b < blocks; ++b)
        wide_row[t * blocks + b] = t * 128 + uniform_int(0, static_cast<int>(std::min<int64_t>(128, n - t * 128) - 1));
    for (int64_t row = 0; row < n; ++row) {
      const int row_top = uniform_int(-6, 2);
      for (int64_t b = 0; b < blocks; ++b) {
        bool wide = spreads[e] == Spreads::Wide;
        if (spreads[e] == Spreads::Mixed) {
          const int64_t kind = (row / 128 + b + e) % 3;
          wide = kind == 1 || (kind == 2 && row == wide_row[(row / 128) * blocks + b]);
        }
        const int spread = wide ? uniform_int(9, 20) : uniform_int(0, 8);
        const int top = row_top + uniform_int(-1, 1);
        int* exps = g.b_exp.data() + (e * n + row) * groups + b * 4;
        for (int i = 0; i < 4; ++i) exps[i] = top - uniform_int(0, spread);
        const int hi = uniform_int(0, 3), lo = (hi + uniform_int(1, 3)) % 4;
        exps[hi] = top;
        exps[lo] = top - spread;
      }
    }
  }

  // Packed codes and stored scales.
  auto scale_shape = weight_scale_shape(g.recipe, n, k);
  const int64_t scale_row = scale_shape[1];  // bytes, words or floats per row
  scale_shape.insert(scale_shape.begin(), experts);
  g.b.weight = HostTensor(DType::U8, {experts, n, k / 2});
  g.b.scale = HostTensor(weight_scale_dtype(g.recipe), scale_shape);
  for (int64_t i = 0; i < experts * n * (k / 2); ++i)
    g.b.weight.ptr<uint8_t>()[i] = fmt::e2m1_pack(static_cast<uint8_t>(uniform_int(0, 15)), static_cast<uint8_t>(uniform_int(0, 15)));
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t r = 0; r < experts * n; ++r) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int exp = g.b_exp[static_cast<size_t>(r * groups + gi)];
      switch (format) {
        case ScaleFormat::UE8M0: g.b.scale.ptr<uint8_t>()[r * scale_row + gi] = static_cast<uint8_t>(exp + 127); break;
        case ScaleFormat::UE8M0_PACKED:  // little-endian: byte j of word i is group 4i + j
          g.b.scale.ptr<uint8_t>()[4 * r * scale_row + gi] = static_cast<uint8_t>(exp + 127);
          break;
        case ScaleFormat::FP32: g.b.scale.ptr<float>()[r * scale_row + gi] = std::ldexp(mantissa(rng()), exp); break;
      }
    }
  }

  // A: random rows quantized with power-of-two group scales; every third row then one-hot (its scales kept).
  const HostTensor x = tools::random_normal(rng(), DType::BF16, {rows, k}, 1.0f);
  g.a = HostTensor(DType::F8_E4M3, {rows, k});
  g.a_scale = HostTensor(DType::F32, {rows, k / a_group});
  quantize_activations(x.view, ActivationRecipe::per_token_group(a_group, true), g.a.view, g.a_scale.view);
  g.one_hot_col.assign(static_cast<size_t>(rows), -1);
  for (int64_t row = 1; row < rows; row += 3) {
    uint8_t code = 0x7F;
    while ((code & 0x7F) == 0x7F) code = static_cast<uint8_t>((uniform_int(0, 1) << 7) | (uniform_int(1, 15) << 3) | uniform_int(0, 7));
    const int64_t col = uniform_int(0, static_cast<int>(k - 1));
    std::memset(g.a.bytes.data() + row * k, 0, static_cast<size_t>(k));
    g.a.bytes[static_cast<size_t>(row * k + col)] = code;
    g.one_hot_col[static_cast<size_t>(row)] = col;
  }
  return g;
}

// Expert e's B dequantized with formats.hpp from the stored bytes: [N, K] doubles (exact).
std::vector<double> dequantized_fp4_expert(const GroupedData& g, int64_t e) {
  const int64_t scale_row = weight_scale_shape(g.recipe, g.n, g.k)[1];
  std::vector<double> w(static_cast<size_t>(g.n * g.k));
  for (int64_t row = 0; row < g.n; ++row) {
    const int64_t r = e * g.n + row;
    for (int64_t col = 0; col < g.k; ++col) {
      const uint8_t code = fmt::e2m1_unpack(g.b.weight.ptr<uint8_t>()[r * (g.k / 2) + col / 2], static_cast<int>(col));
      const int64_t group = col / 32;
      double scale = 0;
      switch (g.recipe.scale_format) {
        case ScaleFormat::UE8M0: scale = fmt::ue8m0_to_float(g.b.scale.ptr<uint8_t>()[r * scale_row + group]); break;
        case ScaleFormat::UE8M0_PACKED:
          scale = fmt::ue8m0_to_float(fmt::ue8m0_unpack(g.b.scale.ptr<int32_t>()[r * scale_row + group / 4], static_cast<int>(group % 4)));
          break;
        case ScaleFormat::FP32: scale = g.b.scale.ptr<float>()[r * scale_row + group]; break;
      }
      w[static_cast<size_t>(row * g.k + col)] = static_cast<double>(fmt::e2m1_to_float(code)) * scale;
    }
  }
  return w;
}

// Row `row` of A dequantized (exact).
std::vector<double> dequantized_a_row(const GroupedData& g, int64_t row) {
  std::vector<double> a(static_cast<size_t>(g.k));
  const int64_t groups = g.k / g.a_group;
  for (int64_t col = 0; col < g.k; ++col)
    a[static_cast<size_t>(col)] = static_cast<double>(fmt::e4m3_to_float(g.a.bytes[static_cast<size_t>(row * g.k + col)])) *
                                  g.a_scale.ptr<float>()[row * groups + col / g.a_group];
  return a;
}

// Expert e owns rows [row0, row0 + count) of A and of the output.
struct ExpertRows {
  int64_t row0 = 0, count = 0;
};

// The reference [rows, N] in double of every owned row (NaN elsewhere). A one-hot row's entry is a single product
// of numbers of ≤ 4, 2, 1 and 24 significant bits: exact.
std::vector<double> fp4_reference(const GroupedData& g, const std::vector<ExpertRows>& owned) {
  const int64_t rows = g.a.view.size(0);
  std::vector<double> ref(static_cast<size_t>(rows * g.n), NAN);
  for (int64_t e = 0; e < g.experts; ++e) {
    if (owned[e].count == 0) continue;
    const std::vector<double> w = dequantized_fp4_expert(g, e);
    for (int64_t row = owned[e].row0; row < owned[e].row0 + owned[e].count; ++row) {
      const std::vector<double> a = dequantized_a_row(g, row);
      std::vector<int64_t> nonzero;
      for (int64_t col = 0; col < g.k; ++col)
        if (a[col] != 0) nonzero.push_back(col);
      for (int64_t n = 0; n < g.n; ++n) {
        double sum = 0;
        for (int64_t col : nonzero) sum += a[col] * w[n * g.k + col];
        ref[static_cast<size_t>(row * g.n + n)] = sum;
      }
    }
  }
  return ref;
}

// Self-checks of the generator: per expert, the (row, K block) pairs that spread ≤ 8 and > 8 follow its plan, and
// among the one-hot outputs some sit in a tile-block that folds with a nonzero shift, and some would lose bits if a
// block spreading > 8 were folded (E2M1·2^-d not exact in E4M3): so the exact check tests both paths.
void expect_fp4_generator_coverage(const GroupedData& g, const std::vector<Spreads>& spreads,
                                   const std::vector<ExpertRows>& owned, const std::string& what) {
  int64_t total_fold = 0, total_wide = 0, folded_shifted = 0, lossy_if_folded = 0;
  const int64_t tiles = (g.n + 127) / 128, blocks = g.k / 128;
  for (int64_t e = 0; e < g.experts; ++e) {
    std::vector<char> folds(static_cast<size_t>(tiles * blocks));
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t b = 0; b < blocks; ++b) folds[t * blocks + b] = tile_folds(g, e, t * 128, b);
    int64_t fold = 0, wide = 0;
    for (int64_t row = 0; row < g.n; ++row)
      for (int64_t b = 0; b < g.k / 128; ++b) (spread_of(g, e, row, b) > 8 ? wide : fold) += 1;
    total_fold += fold;
    total_wide += wide;
    if (spreads[e] == Spreads::Fold) EXPECT_EQ(wide, 0) << what << ": self-check, expert " << e << " folds everywhere";
    if (spreads[e] == Spreads::Wide) EXPECT_EQ(fold, 0) << what << ": self-check, expert " << e << " is wide everywhere";
    if (spreads[e] == Spreads::Mixed) {
      EXPECT_GT(fold, 0) << what << ": self-check, expert " << e << " mixes both";
      EXPECT_GT(wide, 0) << what << ": self-check, expert " << e << " mixes both";
    }
    for (int64_t row = owned[e].row0; row < owned[e].row0 + owned[e].count; ++row) {
      const int64_t col = g.one_hot_col[static_cast<size_t>(row)];
      if (col < 0) continue;
      const int64_t b = col / 128;
      for (int64_t n = 0; n < g.n; ++n) {
        const int d = block_max_exp(g, e, n, b) - b_exp(g, e, n, col / 32);
        const uint8_t code = fmt::e2m1_unpack(g.b.weight.ptr<uint8_t>()[(e * g.n + n) * (g.k / 2) + col / 2], static_cast<int>(col));
        const float shifted = std::ldexp(fmt::e2m1_to_float(code), -d);
        if (folds[(n / 128) * blocks + b]) folded_shifted += d > 0 && code % 8 != 0;
        else if (spread_of(g, e, n, b) > 8) lossy_if_folded += fmt::e4m3_to_float(fmt::e4m3_from_float(shifted)) != shifted;
      }
    }
  }
  EXPECT_GT(total_fold, 0) << what << ": self-check, (expert, row, K block) pairs with spread <= 8";
  EXPECT_GT(total_wide, 0) << what << ": self-check, (expert, row, K block) pairs with spread > 8";
  EXPECT_GT(folded_shifted, 0) << what << ": self-check, one-hot outputs in folding tile-blocks with a shift";
  EXPECT_GT(lossy_if_folded, 0) << what << ": self-check, one-hot outputs a wrong fold would change";
}

// Compares every owned row of out with the reference: random rows by rel (RECIPES.md bars), one-hot rows bit for
// bit (the exact product rounded once to fp32, then to bf16 for a bf16 output).
void expect_fp4_rows(const GroupedData& g, const std::vector<Spreads>& spreads, const std::vector<ExpertRows>& owned,
                     const std::vector<double>& ref, const HostTensor& out, const std::string& what) {
  const DType out_dtype = out.view.dtype;
  for (int64_t e = 0; e < g.experts; ++e) {
    double num = 0, den = 0;
    int64_t non_finite = 0, random_rows = 0, inexact = 0;
    std::string first;
    for (int64_t row = owned[e].row0; row < owned[e].row0 + owned[e].count; ++row) {
      const int64_t col = g.one_hot_col[static_cast<size_t>(row)];
      random_rows += col < 0;
      for (int64_t n = 0; n < g.n; ++n) {
        const double want = ref[static_cast<size_t>(row * g.n + n)];
        const double got = tools::read_float(out.view, row * g.n + n);
        if (col < 0) {
          if (!std::isfinite(got)) {
            ++non_finite;
            continue;
          }
          num += (got - want) * (got - want);
          den += want * want;
          continue;
        }
        float exact = static_cast<float>(want);
        if (out_dtype == DType::BF16) exact = fmt::bf16_to_float(fmt::bf16_from_float(exact));
        if (got == exact) continue;  // NaN (poison) fails; ±0 compare equal
        if (++inexact <= 4) {
          const int64_t b = col / 128;
          first += "\n  y[" + std::to_string(row) + ", " + std::to_string(n) + "] = " + std::to_string(got) + ", want " +
                   std::to_string(exact) + " (k=" + std::to_string(col) + ", block spread " +
                   std::to_string(spread_of(g, e, n, b)) + ", shift " +
                   std::to_string(block_max_exp(g, e, n, b) - b_exp(g, e, n, col / 32)) +
                   (tile_folds(g, e, n, b) ? ", tile folds)" : ", tile promotes per 32)");
        }
      }
    }
    EXPECT_EQ(inexact, 0) << what << " expert " << e << " (" << spreads_name(spreads[e]) << ", " << owned[e].count
                          << " rows): one-hot outputs not exact" << first;
    EXPECT_EQ(non_finite, 0) << what << " expert " << e << ": non-finite outputs";
    if (random_rows == 0) continue;
    ASSERT_GT(den, 0.0) << what << " expert " << e << ": self-check, the reference is not all zero";
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, tolerance(out_dtype)) << what << " expert " << e << " (" << spreads_name(spreads[e]) << ", "
                                         << owned[e].count << " rows, " << random_rows << " random)";
  }
}

// The FP4 cases: UE8M0 bytes with group-128 A take the fold kernels; group-32 A, packed UE8M0 and FP32 scales the
// promote-per-32 kernel.
struct Fp4GroupedCase {
  const char* name;
  ScaleFormat format;
  int a_group;
};
constexpr Fp4GroupedCase kFp4GroupedCases[] = {
    {"mxfp4/ue8m0 x group-128 pow2 (fold kernel)", ScaleFormat::UE8M0, 128},
    {"mxfp4/ue8m0 x group-32 pow2 (promote per 32)", ScaleFormat::UE8M0, 32},
    {"mxfp4/fp32 x group-128 pow2 (promote per 32)", ScaleFormat::FP32, 128},
    {"mxfp4/ue8m0x4 x group-128 pow2 (promote per 32)", ScaleFormat::UE8M0_PACKED, 128},
};

// Masked layout with FP4 experts: the FP8 test's counts (0, 1, max_rows, tile tails); experts of each spread plan.
TEST_F(CudaEdge, GroupedGemmFp4MaskedLayout) {
  const int64_t n = 256, k = 512, max_rows = 150;
  const std::vector<int32_t> counts = {0, 150, 1, 77, 128, 129, 64, 65};
  const std::vector<Spreads> spreads = {Spreads::Mixed, Spreads::Mixed, Spreads::Wide, Spreads::Fold,
                                        Spreads::Wide,  Spreads::Fold,  Spreads::Mixed, Spreads::Fold};
  const int64_t experts = static_cast<int64_t>(counts.size());
  std::vector<ExpertRows> owned;
  for (int64_t e = 0; e < experts; ++e) owned.push_back({e * max_rows, counts[e]});
  for (const Fp4GroupedCase& c : kFp4GroupedCases) {
    GroupedData g = make_grouped_fp4(experts * max_rows, n, k, c.a_group, c.format, spreads);
    for (int64_t e = 0; e < experts; ++e) poison_rows(g, e * max_rows + counts[e], max_rows - counts[e]);
    expect_fp4_generator_coverage(g, spreads, owned, std::string("masked ") + c.name);
    const std::vector<double> ref = fp4_reference(g, owned);
    for (int64_t expected : {16, 150}) {
      for (DType out_dtype : {DType::BF16, DType::F32}) {
        const std::string what = std::string("masked ") + c.name + ", expected rows " + std::to_string(expected) +
                                 ", out " + dtype_name(out_dtype);
        const HostTensor out = run_grouped(g, counts, true, static_cast<int>(max_rows), expected, out_dtype);
        expect_fp4_rows(g, spreads, owned, ref, out, what);
        for (int64_t e = 0; e < experts; ++e)
          EXPECT_TRUE(rows_untouched(out, e * max_rows + counts[e], max_rows - counts[e]))
              << what << ": rows past counts[" << e << "] = " << counts[e] << " were written";
      }
    }
  }
}

// Contiguous layout with FP4 experts: 24 experts (first and last empty, one with 3·128 + 33 rows), N = 320 (an N
// tile of 64 rows: the tail tile's fold decision must not look at the next expert's rows), rows past offsets[E]
// never written.
TEST_F(CudaEdge, GroupedGemmFp4ContiguousLayout) {
  const int64_t experts = 24, n = 320, k = 512, tail_rows = 19;
  std::vector<int32_t> counts(experts);
  for (auto& c : counts) c = uniform_int(1, 40);
  counts[0] = 0;
  counts[experts - 1] = 0;
  counts[10] = 3 * 128 + 33;
  std::vector<Spreads> spreads(experts);
  for (int64_t e = 0; e < experts; ++e) spreads[e] = static_cast<Spreads>(e % 3);
  std::vector<int32_t> offsets(experts + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t routed = offsets[experts];
  std::vector<ExpertRows> owned;
  for (int64_t e = 0; e < experts; ++e) owned.push_back({offsets[e], counts[e]});
  for (const Fp4GroupedCase& c : kFp4GroupedCases) {
    GroupedData g = make_grouped_fp4(routed + tail_rows, n, k, c.a_group, c.format, spreads);
    poison_rows(g, routed, tail_rows);
    expect_fp4_generator_coverage(g, spreads, owned, std::string("contiguous ") + c.name);
    const std::vector<double> ref = fp4_reference(g, owned);
    for (int64_t expected : {16, 128}) {
      for (DType out_dtype : {DType::BF16, DType::F32}) {
        const std::string what = std::string("contiguous ") + c.name + ", expected rows " + std::to_string(expected) +
                                 ", out " + dtype_name(out_dtype);
        const HostTensor out = run_grouped(g, offsets, false, 0, expected, out_dtype);
        expect_fp4_rows(g, spreads, owned, ref, out, what);
        EXPECT_TRUE(rows_untouched(out, routed, tail_rows)) << what << ": rows past offsets[E] were written";
      }
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

// The GEMM's stage-release protocol alone (cluster_ring_probe.cu), in one CTA, in a 2-CTA cluster with the GEMM's
// remote arrival, and with a cluster-scope release on it: every consumer read must see its lap's value. Their point is
// compute-sanitizer racecheck (scripts/gpu-check sanitize runs each alone), which tells whether the hazards it
// reports in the cluster GEMM kernels come from the protocol or from how the tool follows remote arrivals.
TEST_F(CudaEdge, ClusterRingProbeOneCta) { EXPECT_EQ(testing::run_cluster_ring_probe(0), 0); }
TEST_F(CudaEdge, ClusterRingProbePairRemoteArrive) { EXPECT_EQ(testing::run_cluster_ring_probe(1), 0); }
TEST_F(CudaEdge, ClusterRingProbePairReleaseCluster) { EXPECT_EQ(testing::run_cluster_ring_probe(2), 0); }
TEST_F(CudaEdge, ClusterRingProbeThreadArrive) { EXPECT_EQ(testing::run_cluster_ring_probe(3), 0); }

}  // namespace
}  // namespace finegemm
