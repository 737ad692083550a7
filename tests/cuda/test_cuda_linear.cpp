// CUDA linear and activation quantization against the CPU reference, for every recipe, on fresh random data with
// poisoned outputs. Skips itself when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/kernels/fp4_expand.hpp"
#include "cuda/runtime/fp4_expand.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/quant_activations.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"
#include "core/device_buffer.hpp"
#include "cpu/cpu_backend.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

using testing::Buffer;
using testing::ScopedEnv;

constexpr Device kGpu{DeviceType::CUDA, 0};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

struct LinearCase {
  Buffer x, x_scale, w, w_scale, bias, out;
  Buffer x_q, x_q_scale;  // prequantize()
  LinearArgs args;
};

// The case's x quantized to E4M3 on the CPU per its recipe: args take the E4M3 activations and their scales, as a
// caller that quantized them hands them over.
void prequantize(LinearCase& c, const ActivationRecipe& activation) {
  const int64_t m = c.x.view.shape[0], k = c.x.view.shape[1];
  c.x_q = Buffer(DType::F8_E4M3, {m, k});
  c.x_q_scale = Buffer(DType::F32, activation_scale_shape(activation, m, k));
  quantize_activations(c.x, activation, c.x_q, c.x_q_scale);
  c.args.x = c.x_q;
  c.args.x_scale = c.x_q_scale;
}

// c's prequantized activation scales (one per row and group) as an M-major [groups][ld] buffer on the device, the
// entries past M set to `pad`, and the view of them that run_on_gpu takes (the bulk-copy layout of the GEMM).
struct MMajorScales {
  DeviceTensor dev;
  TensorView view;
};
MMajorScales m_major_scales(LinearCase& c, int64_t m, int64_t groups, int64_t ld, float pad) {
  std::vector<float> mem(static_cast<size_t>(groups * ld), pad);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) mem[g * ld + r] = c.x_q_scale.ptr<float>()[r * groups + g];
  MMajorScales out{to_device(TensorView::of(mem.data(), DType::F32, {groups, ld}), kGpu), {}};
  out.view = out.dev.view;
  out.view.shape[0] = m;
  out.view.shape[1] = groups;
  out.view.strides[0] = 1;
  out.view.strides[1] = ld;
  return out;
}

// Random bf16 activations and fp32 master weights quantized per the recipe on the CPU.
LinearCase make_case(const NamedRecipe& recipe, int64_t m, int64_t n, int64_t k, DType x_dtype, DType out_dtype,
                     bool with_bias) {
  LinearCase c;
  c.x = testing::random_tensor(x_dtype, {m, k});
  Buffer w_master = testing::random_tensor(DType::F32, {n, k}, 0.05f);
  c.w = Buffer(recipe.weight.element == ElementType::FP4_E2M1 ? DType::U8 : DType::F8_E4M3,
               {n, weight_storage_cols(recipe.weight, k)});
  c.w_scale = Buffer(weight_scale_dtype(recipe.weight), weight_scale_shape(recipe.weight, n, k));
  quantize_weights(w_master, recipe.weight, c.w, c.w_scale);
  if (recipe.activation.is_static()) {
    c.x_scale = Buffer(DType::F32, {});
    *c.x_scale.ptr<float>() = 4.0f / 448.0f;  // a calibration amax of 4 (normal data rarely exceeds it)
  }
  if (with_bias) c.bias = testing::random_tensor(DType::F32, {n});
  c.out = Buffer(out_dtype, {m, n});
  c.args.x = c.x;
  c.args.x_scale = c.x_scale.view.defined() ? c.x_scale.view : TensorView{};
  c.args.activation = recipe.activation;
  c.args.weight = c.w;
  c.args.weight_scale = c.w_scale;
  c.args.weight_recipe = recipe.weight;
  c.args.bias = with_bias ? c.bias.view : TensorView{};
  c.args.out = c.out;
  return c;
}

// Runs args on the GPU (copies in, poisons the output, runs, copies out) and returns the host output. x_scale_on_device:
// a device x_scale to take instead of copying host_args.x_scale (an M-major view, which to_device would not keep).
// host_args' tensors on the device, `out` copied there as the output, and the args that point at them.
struct DeviceCall {
  DeviceTensor x, xs, w, ws, b, out;
  LinearArgs args;
};
DeviceCall upload(const LinearArgs& host_args, const Buffer& out, const TensorView* x_scale_on_device = nullptr) {
  DeviceCall d{to_device(host_args.x, kGpu),
               to_device(x_scale_on_device ? TensorView{} : host_args.x_scale, kGpu),
               to_device(host_args.weight, kGpu),
               to_device(host_args.weight_scale, kGpu),
               to_device(host_args.bias, kGpu),
               to_device(out, kGpu),
               host_args};
  if (x_scale_on_device) d.xs.view = *x_scale_on_device;
  d.args.x = d.x.view;
  d.args.x_scale = d.xs.view;
  d.args.weight = d.w.view;
  d.args.weight_scale = d.ws.view;
  d.args.bias = d.b.view;
  d.args.out = d.out.view;
  return d;
}

Buffer run_on_gpu(const LinearArgs& host_args, const RunOptions& options = {}, const TensorView* x_scale_on_device = nullptr) {
  Buffer out(host_args.out.dtype, host_args.out.sizes());
  testing::poison(out);
  const DeviceCall d = upload(host_args, out, x_scale_on_device);
  linear(d.args, options);
  synchronize(kGpu);
  copy_to_host(d.out.view, out);
  return out;
}

// The CPU reference's output for the same call, into a fresh [m, n] buffer of out_dtype.
Buffer run_reference(const LinearArgs& args, DType out_dtype, int64_t m, int64_t n) {
  Buffer ref(out_dtype, {m, n});
  LinearArgs ref_args = args;
  ref_args.out = ref;
  linear(ref_args, {Backend::Reference});
  return ref;
}

// The same call with a kernel switch (an environment variable) on ("1") and off ("0"); unset afterwards.
struct SwitchRuns {
  Buffer on, off;
  bool same_bits() const {
    return on.bytes.size() == off.bytes.size() && std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size()) == 0;
  }
};
// The switches it serves belong to the general kernel, so the lean kernel is off meanwhile (at prefill sizes of its
// recipes it would otherwise take both runs, and the comparison would test nothing).
SwitchRuns run_with_switch(const char* env, const LinearArgs& args) {
  const ScopedEnv no_lean("FINEGEMM_GEMM_LEAN", "0");
  setenv(env, "1", 1);
  Buffer on = run_on_gpu(args);
  setenv(env, "0", 1);
  Buffer off = run_on_gpu(args);
  unsetenv(env);
  return {std::move(on), std::move(off)};
}

double tolerance(DType out) { return out == DType::F32 ? 1e-3 : 3e-3; }

class CudaLinearRecipes : public CudaTest, public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(CudaLinearRecipes, MatchesReference) {
  const auto recipes = all_recipes();
  const auto [recipe_index, shape_index] = GetParam();
  const NamedRecipe& recipe = recipes[recipe_index];
  // (M, N, K): decode, tails in M and N, several K blocks, a K that is not a multiple of 128 where allowed.
  const int64_t shapes[][3] = {{1, 256, 512}, {37, 320, 1024}, {130, 576, 2048}, {64, 2112, 7168}, {300, 1024, 384}};
  const auto [m, n, k] = std::tuple{shapes[shape_index][0], shapes[shape_index][1], shapes[shape_index][2]};
  for (DType out_dtype : {DType::BF16, DType::F32}) {
    LinearCase c = make_case(recipe, m, n, k, DType::BF16, out_dtype, shape_index % 2 == 1);
    const Buffer ref = run_reference(c.args, out_dtype, m, n);
    const Buffer got = run_on_gpu(c.args);
    const auto cmp = testing::compare(got, ref);
    EXPECT_EQ(cmp.non_finite, 0) << recipe.name << " M=" << m << " N=" << n << " K=" << k;
    EXPECT_LE(cmp.rel, tolerance(out_dtype)) << recipe.name << " M=" << m << " N=" << n << " K=" << k
                                             << " out=" << dtype_name(out_dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, CudaLinearRecipes,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(all_recipes().size())),
                                            ::testing::Range(0, 5)));

// E4M3 weights in the decode kernel (the default at M ≤ 32, M < 8 at K ≤ 512, and to 64 at K ≥ 8192;
// FINEGEMM_FP8_DECODE=1 here): every recipe it serves (block scales constant over 64-row tiles and 128 of K; activation
// scales over 128 or none), M = 1..64, N and K tails, split-K forced to 1 and 3 and the heuristic's, against the CPU
// reference on a poisoned output; the recipes it does not serve take the general kernel under the same switch and
// must match too.
TEST_F(CudaTest, Fp8WeightsInTheDecodeKernel) {
  // M 1..64 over the four token widths; N and K tails (K % 128 != 0 where the recipe allows it).
  const int64_t shapes[][3] = {{1, 256, 512}, {7, 320, 1152}, {16, 136, 384}, {33, 200, 2048}, {64, 576, 1536}};
  int served = 0;
  const ScopedEnv on("FINEGEMM_FP8_DECODE", "1");
  for (const NamedRecipe& recipe : all_recipes()) {
    if (recipe.weight.element == ElementType::FP4_E2M1) continue;
    const bool decode = recipe.weight.granularity == WeightGranularity::Block && recipe.weight.block_n % 64 == 0 &&
                        recipe.weight.block_k % 128 == 0 &&
                        (recipe.activation.granularity != ActGranularity::PerTokenGroup || recipe.activation.group_size % 128 == 0);
    if (!decode) continue;  // the general kernel, tested everywhere else
    ++served;
    for (const auto& shape : shapes) {
      const auto [m, n, k] = std::tuple{shape[0], shape[1], shape[2]};
      if (recipe.activation.granularity == ActGranularity::PerTokenGroup && k % recipe.activation.group_size != 0) continue;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, m % 2 == 1);
      const Buffer ref = run_reference(c.args, DType::F32, m, n);
      // 64-row CTAs, and 128-row CTAs (two consumer warpgroups, FINEGEMM_DECODE_ROWS=128; N tails inside a tile);
      // each also launched after the activation quantization with programmatic dependent launch (FINEGEMM_PDL=1:
      // the first stages' weights are requested before the kernel waits for the quantization).
      // With a split, also the in-kernel split-K over a cluster (FINEGEMM_DECODE_CLUSTER_REDUCE=1): the same
      // results bit for bit as the workspace and reduce kernel (both sum the splits in order).
      for (const char* rows : {"", "128"})
        for (const char* split : {"", "1", "3"})
          for (const char* pdl : {"", "1"}) {
            const ScopedEnv forced_rows("FINEGEMM_DECODE_ROWS", rows);
            const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
            const ScopedEnv programmatic("FINEGEMM_PDL", pdl);
            const Buffer out = run_on_gpu(c.args);
            const auto cmp = testing::compare(out, ref);
            EXPECT_EQ(cmp.non_finite, 0) << recipe.name << " M=" << m << " N=" << n << " K=" << k << " split=" << split
                                         << " rows=" << rows << " pdl=" << pdl;
            EXPECT_LE(cmp.rel, tolerance(DType::F32)) << recipe.name << " M=" << m << " N=" << n << " K=" << k
                                                      << " split=" << split << " rows=" << rows << " pdl=" << pdl;
            if (std::string(split) == "1") continue;
            const ScopedEnv cluster("FINEGEMM_DECODE_CLUSTER_REDUCE", "1");
            const Buffer in_cluster = run_on_gpu(c.args);
            EXPECT_EQ(in_cluster.bytes, out.bytes) << "cluster reduce: " << recipe.name << " M=" << m << " N=" << n
                                                   << " K=" << k << " split=" << split << " rows=" << rows
                                                   << " pdl=" << pdl;
          }
    }
  }
  EXPECT_GE(served, 4) << "all_recipes() lost the block recipes the decode kernel serves";
}

// args captured in one CUDA graph on a fresh stream and replayed `replays` times, each into an output poisoned on the
// device first; the host outputs of every replay. finishes_captured: the decode launches captured that finish their
// split-K in the kernel (cuda::decode_split_finishes counts them as they are enqueued).
std::vector<Buffer> run_captured(const LinearArgs& host_args, int replays, long long* finishes_captured = nullptr) {
  Buffer out(host_args.out.dtype, host_args.out.sizes());
  const DeviceCall d = upload(host_args, out);
  std::vector<Buffer> outs;
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const long long finishes = cuda::decode_split_finishes();
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  linear(d.args, {Backend::Cuda, stream});
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (finishes_captured) *finishes_captured = cuda::decode_split_finishes() - finishes;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int r = 0; r < replays; ++r) {
    EXPECT_EQ(cudaMemsetAsync(d.out.view.data, 0xFF, out.numel() * dtype_size(out.view.dtype), stream), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    copy_to_host(d.out.view, out);
    outs.push_back(out);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return outs;
}

// The decode kernel's split-K finished by each weight tile's last CTA (FINEGEMM_DECODE_SPLIT_FINISH=1) instead of the
// reduce kernel: the same bits (both sum the splits in order, then the same epilogue), for every recipe the decode
// kernel serves (E4M3 weights in 64- and 128-row CTAs, FP4 weights at 128 and 256 of K per stage), at every token
// width, with N tails (N = 320 at even M: five 64-row tiles, the 128-row CTAs' last one with an idle warpgroup; N = 328
// at odd M: an 8-row last tile, a 128-row one whose second warpgroup has 8 rows, and half a 16-row GEMV tile), splits
// 2, 3 and 4 (5 asked of 16 K blocks), with and without programmatic launches, F32 and BF16 out with a bias on odd M;
// and the FP4 GEMV (FINEGEMM_FP4_GEMV=1 at M <= 16), unsplit and split in 4, which finishes in the kernel in both
// cases. Three eager runs in a row into poisoned outputs (a counter left non-zero would leave the next call's tiles
// unfinished), a launch counter, then the call captured in a graph and replayed three times; the decode kernel
// unsplit never takes it. FINEGEMM_TEST_QUICK=1 (the sanitizer runs): the first recipe of each weight element, M = 1
// and 33.
TEST_F(CudaTest, DecodeSplitFinishSameBits) {
  const ScopedEnv fp8("FINEGEMM_FP8_DECODE", "1");
  const ScopedEnv no_gemv("FINEGEMM_FP4_GEMV", "0");  // the launches below ask for it
  const bool quick = std::getenv("FINEGEMM_TEST_QUICK") != nullptr;
  int served = 0, served_fp4 = 0, served_fp8 = 0;
  for (const NamedRecipe& recipe : all_recipes()) {
    const bool fp4 = recipe.weight.element == ElementType::FP4_E2M1;
    const bool fp8 = !fp4 && recipe.weight.granularity == WeightGranularity::Block && recipe.weight.block_n % 64 == 0 &&
                     recipe.weight.block_k % 128 == 0 &&
                     (recipe.activation.granularity != ActGranularity::PerTokenGroup ||
                      recipe.activation.group_size % 128 == 0);
    if (!fp4 && !fp8) continue;
    ++served;
    if (quick && (fp4 ? served_fp4 : served_fp8) > 0) continue;
    (fp4 ? served_fp4 : served_fp8) += 1;
    // (a vector: the arrays behind initializer_lists picked by ?: die before the loop reads them)
    const std::vector<int64_t> widths = quick ? std::vector<int64_t>{1, 33} : std::vector<int64_t>{1, 16, 33, 64};
    for (const int64_t m : widths) {
      const DType out_dtype = m == 16 ? DType::BF16 : DType::F32;
      const int64_t n = m % 2 == 1 ? 328 : 320;
      LinearCase c = make_case(recipe, m, n, 2048, DType::BF16, out_dtype, m % 2 == 1);
      const Buffer ref = run_reference(c.args, out_dtype, m, n);
      // (the other layout: 128-row CTAs for E4M3 weights, 256 of K per stage for FP4 weights; the GEMV: FP4 weights
      // at M <= 16, split or not, which applies its epilogue in the kernel even unsplit)
      struct Launch {
        bool other_layout, gemv;
        const char *split, *pdl;
      };
      std::vector<Launch> launches = {{false, false, "2", "0"}, {false, false, "5", "1"}, {true, false, "3", "0"}};
      if (fp4 && m <= 16) launches.insert(launches.end(), {{false, true, "1", "0"}, {false, true, "4", "1"}});
      for (const auto& [other_layout, gemv, split, pdl] : launches) {
        const char* layout = other_layout ? (fp4 ? "256" : "128") : "";
        const ScopedEnv rows("FINEGEMM_DECODE_ROWS", fp4 ? "" : layout);
        const ScopedEnv stage_k("FINEGEMM_FP4_DECODE_STAGE_K", fp4 ? layout : "");
        const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
        const ScopedEnv programmatic("FINEGEMM_PDL", pdl);
        const ScopedEnv with_gemv("FINEGEMM_FP4_GEMV", gemv ? "1" : "0");
        const std::string what = recipe.name + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                                 " layout=" + layout + (gemv ? " gemv" : "") + " split=" + split + " pdl=" + pdl;
        Buffer reduced;
        {
          const ScopedEnv off("FINEGEMM_DECODE_SPLIT_FINISH", "0");
          reduced = run_on_gpu(c.args);
        }
        const auto cmp = testing::compare(reduced, ref);
        EXPECT_EQ(cmp.non_finite, 0) << what;
        EXPECT_LE(cmp.rel, tolerance(out_dtype)) << what;
        const ScopedEnv on("FINEGEMM_DECODE_SPLIT_FINISH", "1");
        for (int run = 0; run < 3; ++run) {
          const long long before = cuda::decode_split_finishes();
          const Buffer got = run_on_gpu(c.args);
          EXPECT_EQ(cuda::decode_split_finishes(), before + 1) << what << ": the kernel did not finish its splits";
          EXPECT_EQ(got.bytes, reduced.bytes) << what << " run " << run;
        }
        int replay = 0;
        long long captured = 0;
        for (const Buffer& got : run_captured(c.args, 3, &captured))
          EXPECT_EQ(got.bytes, reduced.bytes) << what << " graph replay " << replay++;
        EXPECT_EQ(captured, 1) << what << ": the captured call did not finish its splits in the kernel";
      }
      // Unsplit: nothing to finish, the plain kernel.
      const ScopedEnv unsplit("FINEGEMM_FP4_DECODE_SPLIT", "1");
      const ScopedEnv on("FINEGEMM_DECODE_SPLIT_FINISH", "1");
      const long long before = cuda::decode_split_finishes();
      const auto cmp = testing::compare(run_on_gpu(c.args), ref);
      EXPECT_EQ(cuda::decode_split_finishes(), before) << recipe.name << " M=" << m << " unsplit";
      EXPECT_LE(cmp.rel, tolerance(out_dtype)) << recipe.name << " M=" << m << " unsplit";
    }
  }
  EXPECT_GE(served, 5) << "all_recipes() lost the recipes the decode kernel serves";
  EXPECT_GE(served_fp4, 1) << "no FP4 recipe ran";
  EXPECT_GE(served_fp8, 1) << "no E4M3 recipe ran";
}

// The decode kernel's loader requesting the weight tiles of two or three stages back to back
// (FINEGEMM_DECODE_LOAD_BATCH): the same arithmetic in the same order, so the same bits as one stage at a time, for
// E4M3 weights at every token width (M = 1, 16, 33, 64), unsplit (K = 4096: 32 stages, the ring wraps five times)
// and split in three; checked against the reference once per shape.
TEST_F(CudaTest, DecodeLoadBatchSameBits) {
  const NamedRecipe recipe = all_recipes()[0];
  const ScopedEnv on("FINEGEMM_FP8_DECODE", "1");
  for (const int64_t m : {1, 16, 33, 64}) {
    LinearCase c = make_case(recipe, m, 320, 4096, DType::BF16, DType::F32, m % 2 == 1);
    const Buffer ref = run_reference(c.args, DType::F32, m, 320);
    for (const char* split : {"1", "3"}) {
      const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
      const Buffer one = run_on_gpu(c.args);
      const auto cmp = testing::compare(one, ref);
      EXPECT_EQ(cmp.non_finite, 0) << "M=" << m << " split=" << split;
      EXPECT_LE(cmp.rel, tolerance(DType::F32)) << "M=" << m << " split=" << split;
      for (const char* batch : {"2", "3"}) {
        const ScopedEnv batched("FINEGEMM_DECODE_LOAD_BATCH", batch);
        const Buffer got = run_on_gpu(c.args);
        EXPECT_EQ(got.bytes, one.bytes) << "M=" << m << " split=" << split << " batch=" << batch;
      }
    }
  }
  const ScopedEnv bad("FINEGEMM_DECODE_LOAD_BATCH", "9");
  LinearCase c = make_case(recipe, 1, 320, 4096, DType::BF16, DType::F32, false);
  EXPECT_THROW(run_on_gpu(c.args), Error);
}

// Every compiled tile config and split-K, forced through FINEGEMM_GEMM_CONFIG, on shapes with tails in M and N,
// for each kind of promotion (128-wide, 32-wide, none).
TEST_F(CudaTest, EveryTileConfig) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[8], recipes[9], recipes[1]};  // block128, 32x32, channel, ue8m0
  // "c2": 2-CTA clusters sharing B (TMA multicast); M = 1 and 200 leave the second CTA of a pair with no or some
  // rows, M = 700 gives several pairs with a partial last one.
  // "192x128": three consumer warpgroups; M = 200 and 700 leave the last tile with 8 and 124 rows ("192x128:1c2":
  // pairs of 384 rows, the second CTA of a pair with no rows at M = 1, 8 at M = 200 and 124 at M = 700).
  // "c2a": pairs of adjacent column blocks sharing A (N = 400: four blocks of 128, the last with 16 columns).
  // "c4": 2x2 blocks sharing A and B (at M = 1 two of the four CTAs have no rows; at M = 700 and 192-row tiles the
  // second block's second row block has 124 rows; N = 400 gives two column pairs, the second with 144 columns, 16 in
  // its second block). ClustersOfFourAcrossTiles runs them over many tiles.
  for (const char* config : {"64x64:1", "64x128:3", "128x64:1", "128x128:2", "128x192:1", "128x192:4", "64x64:5",
                             "128x256:1", "128x256:3", "128x128:1c2", "128x192:1c2", "128x192:3c2", "128x256:1c2",
                             "192x128:1", "192x128:3", "192x128:1c2", "128x128:1c2a", "128x128:3c2a", "192x128:1c2a",
                             "128x128:1c4", "192x128:1c4", "192x128:3c4"}) {
    setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    const bool cluster = std::string(config).find('c') != std::string::npos;
    const bool wide = std::string(config).find("x256") != std::string::npos;
    const bool tall = std::string(config).rfind("192x", 0) == 0;
    for (const auto& recipe : kinds) {
      // Clusters, 256-wide and 192-row tiles are compiled for 128-wide promotion (and none) only.
      if ((cluster || wide || tall) && recipe.weight.granularity == WeightGranularity::Block && recipe.weight.block_k == 32)
        continue;
      for (int64_t m : {1, 200, 700}) {
        const int64_t n = 400, k = 1024;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, true);
        const Buffer ref = run_reference(c.args, DType::BF16, m, n);
        const auto cmp = testing::compare(run_on_gpu(c.args), ref);
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " M=" << m;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " M=" << m;
      }
    }
  }
  // FP4 weights (expanded to E4M3 in shared memory): every FP4 tile config.
  for (const char* config : {"64x64:1", "64x128:2", "128x64:1", "128x128:1", "128x128:3"}) {
    setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    for (const auto& recipe : {recipes[12], recipes[14], recipes[15]}) {
      for (int64_t m : {1, 200}) {
        const int64_t n = 400, k = 1024;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, m == 1);
        const Buffer ref = run_reference(c.args, DType::BF16, m, n);
        const auto cmp = testing::compare(run_on_gpu(c.args), ref);
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " M=" << m;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " M=" << m;
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// Two consumer warpgroups taking turns (pingpong, the default) against issuing freely (FINEGEMM_GEMM_PINGPONG=0):
// the same FMAs in the same order, so bit for bit, and both against the reference. N = 1000 with 192-wide tiles
// gives tiles whose 128-column B scale blocks change after 64 and after 128 columns (the promotion's two split
// paths) and a partial last tile; 128-wide tiles take one B scale; K = 8192 wraps the stage ring many times and,
// at M = 300, CTAs take several tiles. Split-K and the 2-CTA cluster take turns too.
TEST_F(CudaTest, PingpongWarpgroupsAndScaleSplits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[2], recipes[5]};  // block128 fp32/ue8m0/x4, static
  for (const char* config : {"128x192:1", "128x128:1", "128x64:1", "128x192:3", "128x256:1", "128x128:1c2", "128x256:1c2"}) {
    setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    for (const auto& recipe : kinds) {
      for (int64_t k : {1152, 8192}) {
        const int64_t m = 300, n = 1000;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, true);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_PINGPONG", c.args);
        EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " K=" << k;
        if (k > 1152) continue;  // NOTE: the CPU reference at K = 8192 took 2 minutes over the configs
        const Buffer ref = run_reference(c.args, DType::F32, m, n);
        const auto cmp = testing::compare(runs.on, ref);
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " K=" << k;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " K=" << k;
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// Two accumulator sets (FINEGEMM_GEMM_DOUBLE_ACC=1, 128x64 and 128x128 tiles with 128-wide promotion): the next K
// block's wgmma runs while the previous block is promoted. The same FMAs in the same order as one set, so the same
// bits, and both against the reference. K = 1152 (nine K blocks: runs of four, or one of eight, and a single one),
// K = 1536 (runs of four; of eight and four) and K = 8192 (many laps of the stage ring; per-channel scales take the
// promoting kernel past K = 4096); 64-row B scale blocks change the scale inside a 128-wide tile; split-K and the
// 2-CTA cluster run it too; FINEGEMM_GEMM_DOUBLE_RUN=8 takes runs of eight.
TEST_F(CudaTest, DoubleAccumulatorsSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[2], recipes[5], recipes[7], recipes[9]};
  for (const char* config : {"128x128:1", "128x64:1", "128x128:3", "128x128:1c2", "128x128:1c2a", "128x128:1/run8", "128x128:2/run8"}) {
    const std::string cfg(config);
    const bool run8 = cfg.find("/run8") != std::string::npos;
    setenv("FINEGEMM_GEMM_CONFIG", cfg.substr(0, cfg.find('/')).c_str(), 1);
    const testing::ScopedEnv run_length("FINEGEMM_GEMM_DOUBLE_RUN", run8 ? "8" : "");
    for (const auto& recipe : kinds) {
      for (int64_t k : {1152, 1536, 8192}) {
        if (k == 8192 && recipe.name != recipes[0].name && recipe.name != recipes[9].name) continue;
        const int64_t m = 300, n = 1000;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, true);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_DOUBLE_ACC", c.args);
        EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " K=" << k;
        if (k == 8192) continue;  // NOTE: the CPU reference at K = 8192 is slow; the same bits as the checked path
        const Buffer ref = run_reference(c.args, DType::F32, m, n);
        const auto cmp = testing::compare(runs.on, ref);
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " K=" << k;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " K=" << k;
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// The tile config choice is host code (no GPU needed): the heuristic's picks at the bar shapes, forced configs with
// shared-A pairs (the grid counts column-block pairs), and clear errors for configs that have no kernel.
TEST(GemmConfig, ForcedConfigsAndSharedAPairs) {
  {
    const ScopedEnv unset("FINEGEMM_GEMM_CONFIG", "");
    unsetenv("FINEGEMM_GEMM_CONFIG");
    const ScopedEnv no_cluster_env("FINEGEMM_GEMM_CLUSTER", "");
    unsetenv("FINEGEMM_GEMM_CLUSTER");
    const auto big = cuda::choose_gemm_config(4096, 7168, 16384, 128, 132);
    EXPECT_EQ(big.block_m, 192);
    EXPECT_EQ(big.block_n, 128);
    EXPECT_EQ(big.cluster, 2);  // 22 row blocks: pairs sharing B
    EXPECT_FALSE(big.share_a);
    EXPECT_EQ(big.grid, 66);
    const auto odd_rows = cuda::choose_gemm_config(2048, 7168, 16384, 128, 132);  // 11 row blocks, 56 column blocks
    EXPECT_EQ(odd_rows.block_m, 192);
    EXPECT_EQ(odd_rows.cluster, 2);
    EXPECT_TRUE(odd_rows.share_a);
    const auto blockwise32 = cuda::choose_gemm_config(4096, 7168, 16384, 32, 132);  // no clusters with 32-wide promotion
    EXPECT_EQ(blockwise32.cluster, 1);
    // Split-K fills one wave (M = 128, one row block of 128x64 tiles): (N, K) -> splits; ceil(SMs / tiles) overfilled
    // it (N = 4096: 3 splits of 64 tiles, N = 576: 15 of 9).
    for (const auto& [n, k, split] : {std::tuple{4096, 7168, 2}, {576, 7168, 14}, {2112, 7168, 4}}) {
      const auto c = cuda::choose_gemm_config(128, n, k, 128, 132);
      EXPECT_EQ(c.block_m, 128) << n << "x" << k;
      EXPECT_EQ(c.block_n, 64) << n << "x" << k;
      EXPECT_EQ(c.split_k, split) << n << "x" << k;
      EXPECT_EQ(c.grid, (n + 63) / 64 * split) << n << "x" << k;  // every unit in one wave
      EXPECT_LE(c.grid, 132) << n << "x" << k;
    }
    // M = 128 with one wave of 128x64 tiles and no split-K: two rows of 64x128 tiles (stop 28: 48.2 vs 53.6 us at
    // N = 7168 K = 16384, 9.8 vs 10.8 at K = 2048); the split-K shapes above keep 128x64.
    for (const int k : {16384, 2048}) {
      const auto c = cuda::choose_gemm_config(128, 7168, k, 128, 132);
      EXPECT_EQ(c.block_m, 64) << k;
      EXPECT_EQ(c.block_n, 128) << k;
      EXPECT_EQ(c.split_k, 1) << k;
      EXPECT_EQ(c.grid, 112) << k;
    }
    // K <= 512 at M > 256: 192x128 tiles (here in pairs sharing A: three row blocks), not 128x128 (stop 28/29: 28.9 vs
    // 33.3 us at M = 512 N = 32768 K = 512); a longer K keeps 128x128.
    const auto short_k = cuda::choose_gemm_config(512, 32768, 512, 128, 132);
    EXPECT_EQ(short_k.block_m, 192);
    EXPECT_EQ(short_k.block_n, 128);
    EXPECT_EQ(short_k.cluster, 2);
    EXPECT_TRUE(short_k.share_a);
    const auto long_k = cuda::choose_gemm_config(512, 4096, 7168, 128, 132);
    EXPECT_EQ(long_k.block_m, 128);
    EXPECT_EQ(long_k.block_n, 128);
    // At M = 64 the split-K partials count as bytes moved: N = 7168 K = 2048 took 8 splits of 64x64 tiles, whose
    // F32 partials outweighed the weights (stop 25); now one wave of 112 tiles without splits.
    const auto decode64 = cuda::choose_gemm_config(64, 7168, 2048, 128, 132);
    EXPECT_EQ(decode64.block_m, 64);
    EXPECT_EQ(decode64.split_k, 1);
    EXPECT_LE(decode64.grid, 132);
    // Each wave costs a fixed amount: M = 40..64 N = 24576 K = 1536 / 2048 take two waves of 64x128 tiles, not three of
    // 64x64 (stop 31: 16.14 vs 17.05 us at M = 64); the one-wave picks above are unchanged.
    for (const auto& [m, k] : {std::pair{64, 1536}, {48, 1536}, {40, 2048}}) {
      const auto c = cuda::choose_gemm_config(m, 24576, k, 128, 132);
      EXPECT_EQ(c.block_m, 64) << m;
      EXPECT_EQ(c.block_n, 128) << m;
      EXPECT_EQ(c.split_k, 1) << m;
    }
    const auto square = cuda::choose_gemm_config(4096, 4096, 7168, 128, 132);  // two accumulator sets win here
    EXPECT_EQ(square.block_m, 128);
    EXPECT_EQ(square.block_n, 128);
    EXPECT_EQ(square.cluster, 1);
    EXPECT_FALSE(square.share_a);
  }
  {
    const ScopedEnv off("FINEGEMM_GEMM_CLUSTER", "1");
    const auto c = cuda::choose_gemm_config(4096, 7168, 16384, 128, 132);
    EXPECT_EQ(c.block_m, 192);
    EXPECT_EQ(c.cluster, 1);
    EXPECT_EQ(c.grid, 132);
  }
  {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "192x128:1c2a");
    const auto c = cuda::choose_gemm_config(4096, 7168, 16384, 128, 132);
    EXPECT_EQ(c.block_m, 192);
    EXPECT_EQ(c.block_n, 128);
    EXPECT_EQ(c.cluster, 2);
    EXPECT_TRUE(c.share_a);
    EXPECT_EQ(c.grid, 66);  // 22 x 28 tile pairs, at most one cluster per SM pair
    const auto small = cuda::choose_gemm_config(500, 300, 1152, 128, 132);
    EXPECT_EQ(small.grid, 3 * 2);  // 3 row blocks of 192 x 2 pairs of 128-wide column blocks (the last pair half past N)
  }
  {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "128x128:1c2");
    const auto c = cuda::choose_gemm_config(500, 300, 1152, 128, 132);
    EXPECT_FALSE(c.share_a);
    EXPECT_EQ(c.grid, 2 * 3);  // 2 row-block pairs of 256 x 3 column blocks
  }
  {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "192x128:1c4");
    const auto c = cuda::choose_gemm_config(4096, 7168, 16384, 128, 132);
    EXPECT_EQ(c.cluster, 4);
    EXPECT_FALSE(c.share_a);
    EXPECT_EQ(c.grid, 33);  // 11 x 28 blocks of 2x2 tiles, at most one per 4 SMs
    const auto small = cuda::choose_gemm_config(500, 300, 1152, 128, 132);
    EXPECT_EQ(small.grid, 2 * 2);  // 2 row-block pairs of 384 x 2 column-block pairs of 256
  }
  {
    const ScopedEnv four("FINEGEMM_GEMM_CLUSTER", "4");
    const auto c = cuda::choose_gemm_config(4096, 7168, 16384, 128, 132);
    EXPECT_EQ(c.block_m, 192);
    EXPECT_EQ(c.cluster, 4);
    EXPECT_EQ(c.grid, 33);
    const auto blockwise32 = cuda::choose_gemm_config(4096, 7168, 16384, 32, 132);  // no clusters with 32-wide promotion
    EXPECT_EQ(blockwise32.cluster, 1);
  }
  for (const char* bad : {"128x64:1c2a", "128x128:1c2x", "64x128:1c2", "128x256:1c2a", "96x128", "64x128:1c4",
                          "128x256:1c4", "128x128:1c4a", "128x128:1c3"}) {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", bad);
    try {
      (void)cuda::choose_gemm_config(4096, 4096, 7168, 128, 132);
      ADD_FAILURE() << bad << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FINEGEMM_GEMM_CONFIG"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// The lean kernel's default tile height (host code): the cost model's picks at issue 3's prefill shapes, each the
// measured winner of stop 36's A/B (H200: general vs lean 128 vs lean 256 rows), and none below 128 rows.
TEST(GemmConfig, LeanTileHeight) {
  const ScopedEnv unset("FINEGEMM_GEMM_CONFIG", "");
  unsetenv("FINEGEMM_GEMM_CONFIG");
  auto pick = [](int m, int n, int k) {
    cuda::GemmParams p;
    p.m = m;
    p.n = n;
    p.k = k;
    return cuda::lean_gemm_block_m(p, 132);
  };
  // (M, N, K, pick): graph-replay µs general / lean 128 / lean 256 in the comments (stop 36), then lean 192 (stop 39).
  for (const auto& [m, n, k, want] : {std::tuple{4096, 7168, 16384, 256},  // 835 / 747 / 677 (events)
                                      {4096, 4096, 7168, 256},             // 218 / 191 / 176
                                      {4096, 24576, 1536, 256},            // 281 / 271 / 252; 255
                                      {4096, 7168, 2048, 256},             // 115 / 102 / 97
                                      {4096, 2112, 7168, 192},             // 113 / 117 / 127; 97.6
                                      {4096, 576, 7168, 192},              // 35 / 46 / 40; 31.5
                                      {4096, 32768, 512, 192},             // 169.1 / 171.1 / 170.7; 166.4 (pads)
                                      {512, 7168, 16384, 256},             // 123 / 99 / 93
                                      {512, 4096, 7168, 128},              // 30 / 24 / 40
                                      {512, 2112, 7168, 128},              // 24.2 / 21.5 / 38.7
                                      {512, 24576, 1536, 256},             // 42 / 38 / 35
                                      {512, 32768, 512, 256},              // 27.0 / 26.2 / 25.1
                                      {512, 576, 7168, 0},                 // 15 / 21 / 38
                                      {128, 32768, 512, 128},              // 10.4 / 9.2 / 13.7
                                      {128, 24576, 1536, 0},               // 16.0 / 16.9 / 26.5
                                      {128, 7168, 16384, 0},               // 47.2 / 49.8 / 84.6
                                      {128, 4096, 7168, 0},                // 19.1 / 22.2 / 38.9
                                      {128, 2112, 7168, 0},                // 12.9 / 21.4 / 38.3
                                      {128, 576, 7168, 0},                 // 9.6 / 20.9 / 37.9
                                      {64, 32768, 512, 0}}) {              // below kLeanMinM
    EXPECT_EQ(pick(m, n, k), want) << "M=" << m << " N=" << n << " K=" << k;
  }
}

// FINEGEMM_FP4_LEAN's tile height (host code): unset, grouped calls from 64 to 95 rows per expert take 128 rows, from
// 96 to 255 192 rows, and the rest none; 0 off; dense calls take 128 rows for any other value; grouped calls the height given, and for 1 192
// rows from 96 rows per expert, else 128; anything else is an error naming the variable and the value.
TEST(GemmConfig, Fp4LeanSwitch) {
  {
    const ScopedEnv unset("FINEGEMM_FP4_LEAN", "");
    for (const auto& [grouped, rows, want] : {std::tuple{false, int64_t{0}, 0}, {false, int64_t{128}, 0},
                                              {true, int64_t{63}, 0}, {true, int64_t{64}, 128}, {true, int64_t{95}, 128},
                                              {true, int64_t{96}, 192}, {true, int64_t{128}, 192},
                                              {true, int64_t{255}, 192}, {true, int64_t{256}, 0}, {true, int64_t{4096}, 0}})
      EXPECT_EQ(cuda::fp4_lean_block_m(grouped, rows), want) << "unset, grouped=" << grouped << " rows=" << rows;
  }
  const std::tuple<const char*, bool, int64_t, int> cases[] = {
      {"0", false, 0, 0},    {"0", true, 128, 0},    {"1", false, 0, 128},    {"1", true, 96, 192},
      {"1", true, 95, 128},  {"128", true, 500, 128}, {"192", true, 10, 192}, {"256", true, 10, 256},
      {"256", false, 0, 128}};
  for (const auto& [value, grouped, rows, want] : cases) {
    const ScopedEnv env("FINEGEMM_FP4_LEAN", value);
    EXPECT_EQ(cuda::fp4_lean_block_m(grouped, rows), want) << value << " grouped=" << grouped << " rows=" << rows;
  }
  for (const char* bad : {"64", "yes", "2"}) {
    const ScopedEnv env("FINEGEMM_FP4_LEAN", bad);
    try {
      (void)cuda::fp4_lean_block_m(true, 128);
      ADD_FAILURE() << "FINEGEMM_FP4_LEAN=" << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("FINEGEMM_FP4_LEAN"), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
    }
  }
}

// A switch read by `read` (host code): each accepted value gives its setting; anything else is an error naming the
// variable and the value.
template <typename T, typename Read>
void check_switch(const char* name, std::initializer_list<std::pair<const char*, T>> accepted,
                  std::initializer_list<const char*> rejected, Read read) {
  for (const auto& [value, want] : accepted) {
    const ScopedEnv env(name, value);
    EXPECT_EQ(read(), want) << name << "='" << value << "'";
  }
  for (const char* bad : rejected) {
    const ScopedEnv env(name, bad);
    try {
      (void)read();
      ADD_FAILURE() << name << "=" << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(name), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + bad + "'"), std::string::npos) << what;
    }
  }
}

// FINEGEMM_GEMM_LEAN_PAIR: unset by shape (-1), "0" off, "1" pairs sharing B, "a" pairs sharing A; unset resolves to
// pairs sharing A at short K and large M only. FINEGEMM_FP4_LEAN_EXPAND:
// "serial" keeps the serial expansion, unset and "batched" batch, "split" takes two producer warpgroups,
// "consumers" the consumer warpgroups.
// FINEGEMM_FP4_EXPAND_LEAN: unset and "1" on, "0" off. FINEGEMM_FP4_EXPAND_WIDE: unset -1 (the wide scan on
// scan-only calls), "0" off, "1" the wide expansion, "2" that and the wide scan.
TEST(GemmConfig, LeanPairAndFp4ExpandSwitches) {
  check_switch<int>("FINEGEMM_GEMM_LEAN_PAIR", {{"", -1}, {"0", 0}, {"1", 1}, {"a", 2}}, {"2", "yes", "A", "on"},
                    [] { return cuda::lean_pair_mode(); });
  // The shape rule behind the unset switch, at its edges; a set switch wins everywhere.
  const auto params = [](int m, int k) {
    cuda::GemmParams p;
    p.m = m;
    p.n = 4096;
    p.k = k;
    return p;
  };
  EXPECT_EQ(cuda::lean_pair_default(params(4096, 512), -1), 2);
  EXPECT_EQ(cuda::lean_pair_default(params(2048, 1536), -1), 2);
  EXPECT_EQ(cuda::lean_pair_default(params(2048, 1664), -1), 0);
  EXPECT_EQ(cuda::lean_pair_default(params(2047, 512), -1), 0);
  EXPECT_EQ(cuda::lean_pair_default(params(4096, 7168), -1), 0);
  for (int mode : {0, 1, 2}) {
    EXPECT_EQ(cuda::lean_pair_default(params(4096, 512), mode), mode);
    EXPECT_EQ(cuda::lean_pair_default(params(128, 7168), mode), mode);
  }
  check_switch<int>("FINEGEMM_FP4_LEAN_EXPAND",
                    {{"", -1}, {"serial", 0}, {"batched", 1}, {"split", 2}, {"consumers", 3}},
                    {"1", "Batched", "ilp", "consumer"}, [] { return cuda::fp4_lean_expand_mode(); });
  check_switch<int>("FINEGEMM_FP4_LEAN_PACKED_ISSUER", {{"", 0}, {"0", 0}, {"32", 32}}, {"1", "127", "-1", "32x", "warp1"},
                    [] { return cuda::fp4_lean_packed_issuer(); });
  check_switch<bool>("FINEGEMM_FP4_LEAN_PACKED_PAIRS", {{"", false}, {"0", false}, {"1", true}}, {"2", "on", "true", "1x"},
                     [] { return cuda::fp4_lean_packed_pairs(); });
  check_switch<int>("FINEGEMM_FP4_LEAN_ISSUER", {{"", 0}, {"0", 0}, {"light", 1}, {"rotate", 2}},
                    {"1", "2", "Light", "rotated", "on"}, [] { return cuda::fp4_lean_issuer_share(); });
  // Unset: the consumers at grouped 128-row tiles, the batched producers elsewhere; a set mode wins everywhere.
  EXPECT_EQ(cuda::fp4_lean_expand_for(-1, 128, true), 3);
  EXPECT_EQ(cuda::fp4_lean_expand_for(-1, 192, true), 1);
  EXPECT_EQ(cuda::fp4_lean_expand_for(-1, 256, true), 1);
  EXPECT_EQ(cuda::fp4_lean_expand_for(-1, 128, false), 1);
  for (int mode : {0, 1, 2, 3}) {
    EXPECT_EQ(cuda::fp4_lean_expand_for(mode, 128, true), mode);
    EXPECT_EQ(cuda::fp4_lean_expand_for(mode, 192, true), mode);
  }
  check_switch<bool>("FINEGEMM_FP4_EXPAND_LEAN", {{"", true}, {"0", false}, {"1", true}}, {"2", "lean"},
                     [] { return cuda::fp4_expand_lean_wanted(); });
  check_switch<int>("FINEGEMM_FP4_SCAN_STAGED", {{"", -1}, {"0", 0}, {"1", 1}}, {"2", "on"},
                    [] { return cuda::fp4_scan_staged_mode(); });
  check_switch<bool>("FINEGEMM_FP4_SCAN_CACHE", {{"", false}, {"0", false}, {"1", true}}, {"2", "on", "yes"},
                     [] { return cuda::fp4_scan_cache_wanted(); });
  // Unset: staged from 32 K blocks per row; 1 at any length; 0 never.
  EXPECT_TRUE(cuda::fp4_scan_staged_for(-1, 56));
  EXPECT_TRUE(cuda::fp4_scan_staged_for(-1, 32));
  EXPECT_FALSE(cuda::fp4_scan_staged_for(-1, 16));
  EXPECT_TRUE(cuda::fp4_scan_staged_for(1, 16));
  EXPECT_FALSE(cuda::fp4_scan_staged_for(0, 56));
  check_switch<int>("FINEGEMM_GEMM_LEAN_SFB_WARP", {{"", -1}, {"0", 0}, {"1", 1}}, {"2", "on", "yes"},
                    [] { return cuda::lean_sfb_warp_mode(); });
  // Its shape rule at the edges: K <= 1536 at any M, K <= 2048 from M = 2048; a set switch wins everywhere.
  EXPECT_TRUE(cuda::lean_sfb_warp_default(params(128, 512), -1));
  EXPECT_TRUE(cuda::lean_sfb_warp_default(params(512, 1536), -1));
  EXPECT_FALSE(cuda::lean_sfb_warp_default(params(512, 1664), -1));
  EXPECT_FALSE(cuda::lean_sfb_warp_default(params(2047, 2048), -1));
  EXPECT_TRUE(cuda::lean_sfb_warp_default(params(2048, 2048), -1));
  EXPECT_FALSE(cuda::lean_sfb_warp_default(params(4096, 2176), -1));
  EXPECT_FALSE(cuda::lean_sfb_warp_default(params(4096, 7168), -1));
  for (int mode : {0, 1}) {
    EXPECT_EQ(cuda::lean_sfb_warp_default(params(4096, 512), mode), mode == 1);
    EXPECT_EQ(cuda::lean_sfb_warp_default(params(4096, 7168), mode), mode == 1);
  }
  check_switch<int>("FINEGEMM_GEMM_LEAN_STREAMK", {{"", 0}, {"0", 0}, {"1", 1}, {"2", 2}}, {"3", "on", "streamk"},
                    [] { return cuda::lean_stream_k_mode(); });
  check_switch<bool>("FINEGEMM_FP4_GATE_PDL", {{"", false}, {"0", false}, {"1", true}}, {"2", "on", "pdl"},
                     [] { return cuda::fp4_gate_pdl_wanted(); });
  check_switch<bool>("FINEGEMM_GEMM_LEAN_UNIT_EPILOGUE", {{"", true}, {"0", false}, {"1", true}}, {"2", "off"},
                     [] { return cuda::lean_unit_epilogue_wanted(); });
  check_switch<int>("FINEGEMM_FP4_EXPAND_WIDE", {{"", -1}, {"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}}, {"4", "wide"},
                    [] { return cuda::fp4_expand_wide_mode(); });
}

// 2-CTA clusters sharing A ("c2a"): the pair takes adjacent column blocks of one row block, each CTA loading half of
// A into both. N = 300 gives three 128-wide column blocks, so the second CTA of the last pair has no columns at all
// (its B rows lie past N: zero-filled loads, nothing stored); M = 500 leaves a partial row block; K = 1152 (nine K
// blocks) and a 64-row B scale block recipe. Checked against the reference, with the output poisoned. 2x2 clusters
// ("c4") meet both edges at once: with 192-row tiles the second pair of row blocks has 116 rows in its first block
// and none in its second, and the second pair of column blocks 44 columns in its first and none in its second.
TEST_F(CudaTest, SharedATilesPastN) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7]};
  for (const char* config : {"128x128:1c2a", "192x128:1c2a", "128x128:2c2a", "128x128:1c4", "192x128:1c4"}) {
    const ScopedEnv scope("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      const int64_t m = 500, n = 300, k = 1152;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, true);
      const Buffer ref = run_reference(c.args, DType::BF16, m, n);
      const auto cmp = testing::compare(run_on_gpu(c.args), ref);
      EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name;
      EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name;
    }
  }
}

// 2-CTA clusters sharing B ("c2", the default for 192x128 tiles where the row blocks pair up): each CTA loads half of
// B into both. M = 500 gives three 192-row blocks (and four 128-row blocks, the last partial), so with 192-row tiles
// the second CTA of the last pair has no rows at all; N = 300 and K = 1152 as in SharedATilesPastN. Its other use is
// compute-sanitizer racecheck on the default cluster kernels (scripts/gpu-check sanitize).
TEST_F(CudaTest, SharedBTilesPastM) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7]};
  for (const char* config : {"128x128:1c2", "192x128:1c2"}) {
    const ScopedEnv scope("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      const int64_t m = 500, n = 300, k = 1152;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, true);
      const Buffer ref = run_reference(c.args, DType::BF16, m, n);
      const auto cmp = testing::compare(run_on_gpu(c.args), ref);
      EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name;
      EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name;
    }
  }
}

// The lean Store epilogue (on by default; FINEGEMM_GEMM_LEAN_EPILOGUE=0 turns it off): outputs without column scale
// or bias take a loop per dtype without the per-element switches; same arithmetic, so the same bits. Cases that keep
// the general loop (bias, the per-channel recipe's column scales) are compared too, and the default run is checked
// against the reference.
TEST_F(CudaTest, LeanEpilogueSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[5], recipes[7], recipes[8], recipes[9]};
  for (const char* config : {"", "64x64:1", "128x128:1", "128x192:1", "128x64:2", "192x128:1"}) {
    if (*config) setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    for (const auto& recipe : kinds) {
      if (std::string(config) == "192x128:1" && cuda::promotion_k(recipe.weight, recipe.activation) % 128 != 0) continue;
      for (DType out : {DType::BF16, DType::F16, DType::F32}) {
        for (bool bias : {false, true}) {
          const int64_t m = 200, n = 1000, k = 640;
          LinearCase c = make_case(recipe, m, n, k, DType::BF16, out, bias);
          const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_LEAN_EPILOGUE", c.args);
          EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " out=" << dtype_name(out) << " bias=" << bias;
          if (out != DType::BF16 || bias || *config) continue;
          const Buffer ref = run_reference(c.args, out, m, n);
          const auto cmp = testing::compare(runs.on, ref);
          EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
          EXPECT_LE(cmp.rel, 3e-3) << recipe.name;
        }
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// A kernel switch that must not change the bits (1 vs 0, each config with its FINEGEMM_GEMM_DOUBLE_ACC setting), for
// the recipes promoting every 128 of K, at M = 300, N = 1000 and the given K; the default config's run with the
// switch on is also checked against the CPU reference.
void expect_switch_same_bits(const char* env, std::initializer_list<std::pair<const char*, const char*>> configs,
                             const std::vector<NamedRecipe>& kinds, int64_t k) {
  for (const auto& [config, double_acc] : configs) {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config), acc("FINEGEMM_GEMM_DOUBLE_ACC", double_acc);
    for (const auto& recipe : kinds) {
      if (cuda::promotion_k(recipe.weight, recipe.activation) % 128 != 0) continue;
      const int64_t m = 300, n = 1000;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, false);
      const SwitchRuns runs = run_with_switch(env, c.args);
      EXPECT_TRUE(runs.same_bits()) << env << " " << config << " double_acc=" << double_acc << " " << recipe.name;
      if (*config) continue;
      const Buffer ref = run_reference(c.args, DType::F32, m, n);
      const auto cmp = testing::compare(runs.on, ref);
      EXPECT_EQ(cmp.non_finite, 0) << env << " " << recipe.name;
      EXPECT_LE(cmp.rel, 1e-3) << env << " " << recipe.name;
    }
  }
}

// Early stage release (FINEGEMM_GEMM_EARLY_RELEASE=1, off by default): with 128-wide promotion and the B scales in
// registers a consumer warp releases the stage right after its wgmma group completes, before the promotion's FMAs.
// The same arithmetic, so the same bits: 192x128 (alone and in pairs), 128x128 with two accumulator sets and with
// one (pingpong), 128x64; a 64-row B scale block recipe (the scale changes inside the tile) and a per-column one
// (scales read from shared memory after the wait: no early release). K = 8192 wraps the ring many times; M = 300
// gives CTAs several tiles.
TEST_F(CudaTest, EarlyReleaseSameBits) {
  const auto recipes = all_recipes();
  expect_switch_same_bits("FINEGEMM_GEMM_EARLY_RELEASE",
                          {{"192x128:1", "1"}, {"192x128:1c2", "1"}, {"128x128:1", "1"}, {"128x128:1", "0"},
                           {"128x64:1", "1"}, {"", "1"}},
                          {recipes[0], recipes[1], recipes[7], recipes[9]}, 8192);
}

// The lookahead K loop (FINEGEMM_GEMM_LOOKAHEAD: =1 everywhere it serves against =0; the default takes it for 192-row tiles): the single-accumulator loops wait for the next
// stage before the current wgmma group and promote it right before the next issue, in runs of four K blocks; the
// same arithmetic in the same order, so the same bits. Every kernel it serves (not those with two accumulator sets,
// nor 128x192): 192x128 alone, in pairs sharing B or A and in 2x2 blocks, 64x128, 64x64; with the stage released after
// the next issue (FINEGEMM_GEMM_DEFER_RELEASE=1) and released early (FINEGEMM_GEMM_EARLY_RELEASE=1). K = 2048 (16 K
// blocks: whole runs) and 1408 (11: two runs of four and three single blocks) wrap the ring; M = 300 gives CTAs
// several tiles; the default config's run is checked against the reference once per recipe.
TEST_F(CudaTest, LookaheadSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7], recipes[9]};
  for (int64_t k : {2048, 1408}) {
    expect_switch_same_bits("FINEGEMM_GEMM_LOOKAHEAD",
                            {{"", "1"}, {"192x128:1", "1"}, {"192x128:1c2", "1"}, {"192x128:1c2a", "1"}, {"192x128:1c4", "1"},
                             {"64x128:1", "1"}, {"64x64:1", "1"}},
                            kinds, k);
  }
  for (const char* env : {"FINEGEMM_GEMM_DEFER_RELEASE", "FINEGEMM_GEMM_EARLY_RELEASE"}) {
    const ScopedEnv variant(env, "1");
    expect_switch_same_bits("FINEGEMM_GEMM_LOOKAHEAD", {{"192x128:1", "1"}, {"192x128:1c2", "1"}, {"64x128:1", "1"}}, kinds, 1408);
  }
}

// 128x128 tiles from the kernels compiled with one accumulator set (FINEGEMM_GEMM_ONE_ACC=1, off by default), which
// take the lookahead loop with pingpong issue, against the default kernels' two sets: the same arithmetic in the same
// order, so the same bits. Alone and in pairs sharing B (F32 output: the lean store) and the TMA-store kernel (BF16),
// with the lookahead (their default) and without it (FINEGEMM_GEMM_LOOKAHEAD=0); K = 2048 and 1408 (runs of four and
// single blocks); M = 300 gives CTAs several tiles; the pairs' run is checked against the reference once per recipe.
TEST_F(CudaTest, OneAccumulatorSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7], recipes[9]};
  for (const char* lookahead : {"", "0"}) {
    const ScopedEnv la("FINEGEMM_GEMM_LOOKAHEAD", lookahead);
    for (const auto& recipe : kinds) {
      if (cuda::promotion_k(recipe.weight, recipe.activation) % 128 != 0) continue;
      for (int64_t k : {2048, 1408}) {
        for (const char* config : {"128x128:1", "128x128:1c2"}) {
          for (DType out : {DType::F32, DType::BF16}) {
            const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
            const int64_t m = 300, n = 1000;
            LinearCase c = make_case(recipe, m, n, k, DType::BF16, out, false);
            const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_ONE_ACC", c.args);
            EXPECT_TRUE(runs.same_bits()) << config << " lookahead='" << lookahead << "' " << recipe.name << " k=" << k
                                          << " out=" << dtype_name(out);
            if (*lookahead || k != 1408 || out != DType::BF16 || std::string(config) != "128x128:1c2") continue;
            const Buffer ref = run_reference(c.args, out, m, n);
            const auto cmp = testing::compare(runs.on, ref);
            EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
            EXPECT_LE(cmp.rel, 3e-3) << recipe.name;
          }
        }
      }
    }
  }
}

// One stage release per consumer thread (FINEGEMM_GEMM_THREAD_RELEASE, on by default since stop 32) or one per warp after
// __syncwarp: the same arithmetic, so the same bits. Every kernel shape that releases stages: 192x128 alone, in pairs
// sharing B and A and in 2x2 blocks (the peers' arrivals stay one per warp), 128x128 with two accumulator sets and with
// one (pingpong), 128x64, 64x128, split-K, the idle-warpgroup loop (M = 300: 192-row tiles leave warpgroups without
// rows), early release with it; K = 2048 wraps the ring; checked against the reference once per recipe.
TEST_F(CudaTest, ThreadReleaseSameBits) {
  const auto recipes = all_recipes();
  expect_switch_same_bits("FINEGEMM_GEMM_THREAD_RELEASE",
                          {{"", "1"}, {"192x128:1", "1"}, {"192x128:1c2", "1"}, {"192x128:1c2a", "1"}, {"192x128:1c4", "1"},
                           {"128x128:1", "1"}, {"128x128:1", "0"}, {"128x128:1c2", "1"}, {"128x64:1", "1"}, {"64x128:1", "1"},
                           {"128x128:3", "1"}},
                          {recipes[0], recipes[1], recipes[7], recipes[9]}, 2048);
  const ScopedEnv early("FINEGEMM_GEMM_EARLY_RELEASE", "1");
  expect_switch_same_bits("FINEGEMM_GEMM_THREAD_RELEASE", {{"", "1"}, {"128x128:1", "1"}},
                          {recipes[0], recipes[1]}, 2048);
}

// The TMA-store epilogue (on by default; FINEGEMM_GEMM_TMA_STORE=0 takes the lean store): the same values as the lean
// store, so the same bits, in BF16 and F16 (F32 and rows of an odd byte stride take the lean store), for every tile
// config it serves (192x128 alone and in pairs sharing B or A, 128x64, 128x128, 128x192). M = 700 leaves a tile (and a
// pair's second tile) partly and wholly past M (TMA clips the rows), N = 1000 a partial last column block; K = 512 and
// 2048 (the ring wraps); the switched-on run is checked against the reference once per recipe, K and config.
TEST_F(CudaTest, TmaStoreSameBits) {
  const auto recipes = all_recipes();
  for (const auto& recipe : {recipes[0], recipes[1], recipes[9]}) {
    if (cuda::promotion_k(recipe.weight, recipe.activation) % 128 != 0) continue;
    for (int64_t k : {512, 2048}) {
      for (DType out : {DType::BF16, DType::F16, DType::F32}) {
        const int64_t m = 700, n = 1000;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, out, false);
        const Buffer ref = out == DType::BF16 ? run_reference(c.args, out, m, n) : Buffer{};
        for (const char* config : {"192x128:1c2", "192x128:1c2a", "192x128:1", "128x64:1", "128x128:1", "128x192:1"}) {
          const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
          const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_TMA_STORE", c.args);
          EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " k=" << k << " out=" << dtype_name(out);
          if (out != DType::BF16) continue;
          const auto cmp = testing::compare(runs.on, ref);
          EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name;
          EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " k=" << k;
        }
      }
    }
  }
}

// The K loop compiled for tiles with one B scale, and for 192-wide tiles' two-scale patterns (FINEGEMM_GEMM_HOIST_SPLIT,
// on by default; compared with =0): no K block tests the promotion variant. Same arithmetic, so the same bits: 128x128
// with two accumulator sets and with one, 192x128 alone and in pairs, 128x64, 128x192 alone and in pairs (splits at
// chunks 16 and 8); the 64-row B block recipe keeps the general loop on 128-wide tiles. K = 2048 wraps the ring; M = 300 gives CTAs several tiles; checked against the reference once
// per recipe.
TEST_F(CudaTest, HoistedSplitSameBits) {
  const auto recipes = all_recipes();
  expect_switch_same_bits("FINEGEMM_GEMM_HOIST_SPLIT",
                          {{"", "1"}, {"128x128:1", "1"}, {"128x128:1", "0"}, {"192x128:1", "1"}, {"192x128:1c2", "1"},
                           {"128x192:1", "1"}, {"128x192:1c2", "1"}, {"128x64:1", "1"}, {"128x128:3", "1"}},
                          {recipes[0], recipes[1], recipes[2], recipes[7]}, 2048);
}

// Three consumer warpgroups issuing their wgmma groups in a ring of named barriers (FINEGEMM_GEMM_ROTATE_ISSUE=1, off
// by default): the same arithmetic in another order of issue, so the same bits. 192x128 alone, in pairs sharing B and
// in 2x2 blocks; M = 300 leaves the second row block's last warpgroup without rows (it still issues, in turn, since
// the ring needs every warpgroup); K = 2048 wraps the ring; checked against the reference once per recipe.
TEST_F(CudaTest, RotatedIssueSameBits) {
  const auto recipes = all_recipes();
  expect_switch_same_bits("FINEGEMM_GEMM_ROTATE_ISSUE", {{"", "1"}, {"192x128:1", "1"}, {"192x128:1c2", "1"}, {"192x128:1c4", "1"}},
                          {recipes[0], recipes[1], recipes[2], recipes[7]}, 2048);
}

// L2 prefetch of B's tiles ahead of the ring (FINEGEMM_GEMM_L2_PREFETCH=D, off by default): a request into L2 only,
// so the same bits at distances 1 and 5 as without. Prefill tile configs (alone, pairs sharing B or A, 2x2 blocks,
// split-K, several tiles per CTA at M = 300 so the prefetch cursor crosses tile ends; K = 1152 with distance 5 runs
// past the last tile) and decode sizes (M = 1 and 16: the decode kernel's weight tiles, split-K); checked against the
// reference once per recipe and size.
TEST_F(CudaTest, L2PrefetchSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7]};
  for (const char* config : {"", "128x128:1", "192x128:1", "192x128:1c2", "128x128:1c2a", "128x128:1c4", "128x64:3",
                             "64x128:1"}) {
    const testing::ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      for (int64_t m : {1, 16, 300}) {
        if (*config && m < 300) continue;
        const int64_t n = 1000, k = 1152;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, false);
        setenv("FINEGEMM_GEMM_L2_PREFETCH", "0", 1);
        const Buffer off = run_on_gpu(c.args);
        for (const char* distance : {"1", "5"}) {
          setenv("FINEGEMM_GEMM_L2_PREFETCH", distance, 1);
          const Buffer on = run_on_gpu(c.args);
          EXPECT_TRUE(on.bytes == off.bytes)
              << config << " " << recipe.name << " M=" << m << " distance " << distance;
        }
        unsetenv("FINEGEMM_GEMM_L2_PREFETCH");
        if (*config) continue;
        const Buffer ref = run_reference(c.args, DType::F32, m, n);
        const auto cmp = testing::compare(off, ref);
        EXPECT_EQ(cmp.non_finite, 0) << recipe.name << " M=" << m;
        EXPECT_LE(cmp.rel, 1e-3) << recipe.name << " M=" << m;
      }
    }
  }
}

// B's tile by one TMA copy of BLOCK_N rows (FINEGEMM_GEMM_B_ONE_BOX, on by default since stop 29; compared with =0)
// where the CTA loads all of it:
// the same bytes in the same swizzled layout, so the same bits. Every tile width (64, 128, 192, 256), pairs sharing A
// (each CTA its own B), pairs sharing B (multicast halves: the switch leaves them alone), split-K; N = 1000 ends inside
// a tile (the box reads past N, zero-filled); M = 300 gives CTAs several tiles; checked against the reference once per
// recipe.
TEST_F(CudaTest, OneBoxBSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[2], recipes[7], recipes[9]};
  for (const char* config : {"", "128x128:1", "192x128:1", "128x64:1", "64x128:1", "64x64:1", "128x192:1", "128x256:1",
                             "128x128:1c2a", "192x128:1c2a", "192x128:1c2", "128x128:3"}) {
    const testing::ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      const int64_t m = 300, n = 1000, k = 1024;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, false);
      const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_B_ONE_BOX", c.args);
      EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name;
      if (*config) continue;
      const Buffer ref = run_reference(c.args, DType::F32, m, n);
      const auto cmp = testing::compare(runs.on, ref);
      EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
      EXPECT_LE(cmp.rel, 1e-3) << recipe.name;
    }
  }
}

// The A scales by one bulk copy per stage (FINEGEMM_GEMM_SCALE_BULK=1, off by default): linear() quantizes BF16 x
// with M-major scales ([K/128, M rounded up to 4]) and the GEMM's TMA thread copies each stage's run of the tile's
// rows with cp.async.bulk, so the loader warps stage the B scales only. Same scales and arithmetic, so the same bits:
// every 128-promoting tile config (pairs sharing B with the last pair's second CTA past M, pairs sharing A, 2x2 blocks
// with a block's second row block empty, split-K),
// FP32 / UE8M0 / packed / 64-row B scale blocks, M = 301 (three padding rows in the scale layout, a partial last row
// block) and M = 1000; checked against the reference once per recipe.
TEST_F(CudaTest, BulkScaleCopiesSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[2], recipes[7]};
  for (const char* config : {"", "128x128:1", "192x128:1", "192x128:1c2", "128x128:1c2", "128x128:1c2a",
                             "192x128:1c2a", "128x128:1c4", "192x128:1c4", "128x192:1", "128x256:1", "128x64:1",
                             "64x128:1", "64x64:1", "128x128:3"}) {
    const testing::ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      for (int64_t m : {301, 1000}) {
        const int64_t n = 1000, k = 1024;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, false);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_SCALE_BULK", c.args);
        EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " M=" << m;
        if (*config || m != 301) continue;
        const Buffer ref = run_reference(c.args, DType::F32, m, n);
        const auto cmp = testing::compare(runs.on, ref);
        EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
        EXPECT_LE(cmp.rel, 1e-3) << recipe.name;
      }
    }
  }
}

// The lean epilogue's wide stores (FINEGEMM_GEMM_WIDE_STORES, on by default for dense calls): each quad of lanes transposes its
// chunks by shuffles and a lane stores eight columns at once; same values, so the same bits as the default stores.
// Every tile shape (clusters too), BF16 / F16 / F32 outputs, a partial last row block (M = 200) and a partial last
// column tile (N = 1000: 104 columns of the last 128-wide tile, part of a chunk group); checked against the reference
// once per recipe.
TEST_F(CudaTest, WideStoresSameBits) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[9]};
  for (const char* config : {"", "64x64:1", "128x64:1", "128x128:1", "128x192:1", "192x128:1", "192x128:1c2",
                             "192x128:1c2a", "128x128:1c2", "192x128:1c4"}) {
    const testing::ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      const bool promote128 = cuda::promotion_k(recipe.weight, recipe.activation) % 128 == 0;
      const std::string cfg(config);
      if ((cfg.rfind("192", 0) == 0 || cfg.find("c2") != std::string::npos) && !promote128) continue;
      for (DType out : {DType::BF16, DType::F16, DType::F32}) {
        const int64_t m = 200, n = 1000, k = 640;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, out, false);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_WIDE_STORES", c.args);
        EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " out=" << dtype_name(out);
        if (out != DType::BF16 || *config) continue;
        const Buffer ref = run_reference(c.args, out, m, n);
        const auto cmp = testing::compare(runs.on, ref);
        EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
        EXPECT_LE(cmp.rel, 3e-3) << recipe.name;
      }
    }
  }
}

// Warpgroups whose 64 rows all lie past M skip the tile's wgmma: M = 40 (every warpgroup but the first), M = 130
// (warpgroup 1 of the second 128-row tile), M = 200 (warpgroups 1 and 2 of the second 192-row tile). The same bits as
// FINEGEMM_GEMM_SKIP_IDLE=0, and the reference's values. 128x128 runs with pingpong off (pingpong ordering keeps
// every warpgroup issuing).
// NOTE: idle rows are never stored, so this guards the stage bookkeeping (a hang, or a wrong neighbouring tile), not
// whether the skip happens; bench_cuda_moe with FINEGEMM_GEMM_SKIP_IDLE=0 and 1 measured that it does.
TEST_F(CudaTest, IdleWarpgroupsSkipTheirWgmma) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7]};
  setenv("FINEGEMM_GEMM_PINGPONG", "0", 1);
  for (const char* config : {"192x128:1", "128x128:1", "128x256:1"}) {
    setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    for (const auto& recipe : kinds) {
      if (std::string(config) != "128x128:1" && cuda::promotion_k(recipe.weight, recipe.activation) % 128 != 0) continue;
      for (int64_t m : {40, 130, 200}) {
        const int64_t n = 640, k = 512;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, false);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_SKIP_IDLE", c.args);
        EXPECT_TRUE(runs.same_bits()) << config << " " << recipe.name << " M=" << m;
        const auto cmp = testing::compare(runs.on, run_reference(c.args, DType::BF16, m, n));
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " M=" << m;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " M=" << m;
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
  unsetenv("FINEGEMM_GEMM_PINGPONG");
}

// 192x128 tiles (three consumer warpgroups) over more tiles than SMs, so that CTAs carry their stage phases and
// loader cursors from one tile to the next, with 64-row B scale blocks (the scale changes inside a tile) among the
// recipes.
TEST_F(CudaTest, ThreeConsumerWarpgroupsAcrossTiles) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7], recipes[9]};
  setenv("FINEGEMM_GEMM_CONFIG", "192x128:1", 1);
  for (const auto& recipe : kinds) {
    const int64_t m = 1600, n = 2000, k = 256;  // 9 x 16 = 144 tiles
    LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, true);
    const Buffer ref = run_reference(c.args, DType::BF16, m, n);
    const auto cmp = testing::compare(run_on_gpu(c.args), ref);
    EXPECT_EQ(cmp.non_finite, 0) << recipe.name;
    EXPECT_LE(cmp.rel, 3e-3) << recipe.name;
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// 2x2 clusters ("c4") over more blocks than fit at once (about 32 clusters of four on the H200), so that each CTA
// carries its stage phases and loader cursors, with empty barriers released by three CTAs, from one tile to the next:
// M = 1600 N = 1800 K = 2048 gives 5 x 8 blocks of 192x128 tiles and 7 x 8 of 128x128, the last row pair with 64
// rows in its first block and none in its second (either tile height), the last column pair 8 columns and none.
// M = 100 and 300 leave whole CTAs without rows on the promoting kernels (the second row block of the pair).
TEST_F(CudaTest, ClustersOfFourAcrossTiles) {
  const auto recipes = all_recipes();
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[7], recipes[9]};
  for (const char* config : {"192x128:1c4", "128x128:1c4"}) {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    for (const auto& recipe : kinds) {
      for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1600, 1800, 2048}, {100, 1800, 1024},
                                    {300, 400, 1024}}) {
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, true);
        const Buffer ref = run_reference(c.args, DType::BF16, m, n);
        const auto cmp = testing::compare(run_on_gpu(c.args), ref);
        EXPECT_EQ(cmp.non_finite, 0) << config << " " << recipe.name << " M=" << m << " N=" << n;
        EXPECT_LE(cmp.rel, 3e-3) << config << " " << recipe.name << " M=" << m << " N=" << n;
      }
    }
  }
}

// FINEGEMM_GEMM_CHUNK_SCALES=1: the scale loaders store one B scale per 8-column chunk instead of one per column.
// The consumers read chunk starts only, so the results are the same bits. 192-wide tiles over N = 1000 give both
// places where a 128-column scale block changes inside a tile; 64x128 blocks change every 64 columns.
TEST_F(CudaTest, ChunkScalesMatchPerColumnScales) {
  const auto recipes = all_recipes();
  // (The 32-wide promotion kernels keep per-column scales: chunk scales serve the 128-wide promotion only.)
  const std::vector<NamedRecipe> kinds = {recipes[0], recipes[1], recipes[2], recipes[5], recipes[7]};
  for (const char* config : {"128x192:1", "128x128:1", "64x64:1", "64x128:2", "128x256:1", "128x192:1c2"}) {
    setenv("FINEGEMM_GEMM_CONFIG", config, 1);
    for (const auto& recipe : kinds) {
      for (int64_t m : {1, 300}) {
        LinearCase c = make_case(recipe, m, 1000, 1152, DType::BF16, DType::F32, true);
        EXPECT_TRUE(run_with_switch("FINEGEMM_GEMM_CHUNK_SCALES", c.args).same_bits())
            << config << " " << recipe.name << " M=" << m;
      }
    }
  }
  unsetenv("FINEGEMM_GEMM_CONFIG");
}

// The recipes without K-granular scales (per-tensor, per-channel, per-token) move the wgmma accumulator into FP32
// every 128 of K when K > 4096 (gemm_launch.cuh: fp32_accum_wanted). What linear() does by default must meet
// RECIPES.md's 1e-3 (F32 out) at K = 4096 (plain kernels) and K = 16384 (promoted). The forced modes
// (FINEGEMM_GEMM_FP32_ACCUM=1 / 0) are printed beside it; the wgmma accumulator alone measured 1.02e-3 at K = 16384
// on the H200, which is why the default promotes there.
TEST_F(CudaTest, Fp32AccumulationOfUnscaledRecipes) {
  int cases = 0;
  for (const auto& recipe : all_recipes()) {
    const bool k_scaled = recipe.weight.granularity == WeightGranularity::Block ||
                          recipe.weight.granularity == WeightGranularity::MX ||
                          recipe.activation.granularity == ActGranularity::PerTokenGroup;
    if (k_scaled) continue;
    for (int64_t k : {4096, 16384}) {
      for (int64_t m : {64, 300}) {
        const int64_t n = 512;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::F32, true);
        const Buffer ref = run_reference(c.args, DType::F32, m, n);
        const auto by_default = testing::compare(run_on_gpu(c.args), ref);
        const SwitchRuns runs = run_with_switch("FINEGEMM_GEMM_FP32_ACCUM", c.args);
        const auto plain = testing::compare(runs.off, ref);
        const auto promoted = testing::compare(runs.on, ref);
        std::printf("%s M=%lld K=%lld: rel %.3e default, %.3e wgmma accumulator, %.3e FP32 every 128\n",
                    recipe.name.c_str(), static_cast<long long>(m), static_cast<long long>(k), by_default.rel,
                    plain.rel, promoted.rel);
        EXPECT_EQ(by_default.non_finite, 0) << recipe.name << " M=" << m << " K=" << k;
        EXPECT_LE(by_default.rel, 1e-3) << recipe.name << " M=" << m << " K=" << k;
        EXPECT_EQ(promoted.non_finite, 0) << recipe.name << " M=" << m << " K=" << k;
        EXPECT_LE(promoted.rel, 1e-3) << recipe.name << " M=" << m << " K=" << k;
        // The plain kernels stay a comparison mode past K = 4096: bounded by the bf16-output bar there.
        EXPECT_LE(plain.rel, k > 4096 ? 3e-3 : 1e-3) << recipe.name << " M=" << m << " K=" << k;
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, 4) << "all_recipes() lost its unscaled-along-K recipes";
}

TEST_F(CudaTest, PreQuantizedActivationsAndFp16) {
  const auto recipe = all_recipes()[0];  // block 128×128, group 128
  const int64_t m = 77, n = 384, k = 1536;
  LinearCase c = make_case(recipe, m, n, k, DType::F16, DType::F16, true);
  prequantize(c, recipe.activation);
  const Buffer ref = run_reference(c.args, DType::F16, m, n);
  const auto cmp = testing::compare(run_on_gpu(c.args), ref);
  EXPECT_EQ(cmp.non_finite, 0);
  EXPECT_LE(cmp.rel, 3e-3);
}

// Pre-quantized activations with M-major group scales (an [M, G] view with strides [1, ld]: cuBLASLt's and DeepGEMM's
// layout): the same bits as row-major ones. The GEMM copies them per stage in bulk where M % 4 == 0 and ld is a
// multiple of 4, and gathers them otherwise: decode sizes (M = 1, 16, 64), M = 128, 300 (M % 4 != 0) and 512, with
// ld = M rounded up to 4, M + 9 and M rounded up to 4 plus 8, the gaps NaN (never read into a stored row); the tile
// configs at M = 512. Checked against the CPU reference once per recipe and M.
TEST_F(CudaTest, MMajorActivationScalesSameBits) {
  std::vector<NamedRecipe> kinds;
  for (const auto& r : all_recipes())
    if (r.activation.granularity == ActGranularity::PerTokenGroup && r.weight.element != ElementType::FP4_E2M1 &&
        kinds.size() < 3)
      kinds.push_back(r);
  ASSERT_GE(kinds.size(), 2u);
  for (const auto& recipe : kinds) {
    for (int64_t m : {1, 16, 64, 128, 300, 512}) {
      const int64_t n = 512, k = 1024, groups = k / recipe.activation.group_size, m4 = (m + 3) / 4 * 4;
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, false);
      prequantize(c, recipe.activation);
      const Buffer ref = run_reference(c.args, DType::BF16, m, n);
      for (const char* config : {"", "128x128:1c2", "192x128:1c2", "128x192:1", "128x64:1"}) {
        if (*config && m != 512) continue;
        const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
        const Buffer row_major = run_on_gpu(c.args);
        if (!*config) {
          const auto cmp = testing::compare(row_major, ref);
          EXPECT_EQ(cmp.non_finite, 0) << recipe.name << " M=" << m;
          EXPECT_LE(cmp.rel, tolerance(DType::BF16)) << recipe.name << " M=" << m;
        }
        for (int64_t ld : {m4, m + 9, m4 + 8}) {
          const MMajorScales scales = m_major_scales(c, m, groups, ld, NAN);
          const Buffer out = run_on_gpu(c.args, {}, &scales.view);
          EXPECT_EQ(out.bytes, row_major.bytes) << recipe.name << " M=" << m << " ld=" << ld << " config=" << config;
        }
      }
    }
  }
}

// The lean kernel (sm90_fp8_gemm_lean.cuh; FINEGEMM_GEMM_LEAN=1 forces 128x128 tiles, =192 192x128 (three consumer
// warpgroups), =256 256x128, =0 turns it off)
// against the general kernel's 128x128 tiles (FINEGEMM_GEMM_CONFIG=128x128:1 with the lean kernel off, the TMA-store
// epilogue): the same arithmetic in the same order, so the same bits, on every recipe it serves (128x128 weight blocks
// with FP32, UE8M0 and packed UE8M0 scales; 1x128 activations through M-major scales, the bulk copy, both prequantized
// and quantized by the library from BF16; static per-tensor activations with no A scales), checked against the
// reference too, with a launch counter that proves the lean kernel ran. Shapes: M and N tails (M = 300 leaves a
// 256-row tile 44 rows and a 192-row tile 108, so its third warpgroup no rows; M = 516 a 128-row tile 4 and a
// one-word scale copy, M = 96 a 256-row tile without its second half), one K block, K blocks that leave the last lap
// partial for every stage count (K = 1280: ten blocks; 1408: eleven) and that fill every lap (K = 1536: twelve),
// and more tiles than SMs at every height with partial last laps (M = 2048, N = 2176, K = 1408: 136 tiles of 256
// rows, 187 of 192, 272 of 128), with A scales and without. BF16 and F16 output. Then the default choice: with the
// switch unset a shape that fills the GPU takes the lean kernel and one of M <= 64 does not, a forced general config
// keeps it off, and an unknown value is refused with a clear error. Every height runs alone and in 2-CTA clusters
// sharing B (FINEGEMM_GEMM_LEAN_PAIR=1) or A (=a), each pair's launch counted. FINEGEMM_TEST_QUICK=1 (the sanitizer
// runs): the first recipe with A scales and the first static one, at M = 300, 128 and 516 (tails, one K block, odd
// row-block counts for the pairs sharing B, an odd column-block count at N = 384 for those sharing A).
TEST_F(CudaTest, LeanKernelSameBits) {
  const bool quick = std::getenv("FINEGEMM_TEST_QUICK") != nullptr;
  std::vector<NamedRecipe> kinds;
  for (const auto& r : all_recipes())
    if (r.weight.element != ElementType::FP4_E2M1 && r.weight.granularity == WeightGranularity::Block &&
        r.weight.block_n == 128 && r.weight.block_k == 128 &&
        ((r.activation.granularity == ActGranularity::PerTokenGroup && r.activation.group_size == 128) ||
         r.activation.is_static()))
      kinds.push_back(r);
  ASSERT_GE(kinds.size(), 6u) << "all_recipes() lost the block-128 recipes with 1x128 or static activations";
  const int64_t shapes[][3] = {{300, 1000, 1408}, {128, 256, 128}, {516, 384, 1280}, {96, 640, 768},
                               {256, 512, 1536}, {2048, 2176, 1408}};
  int static_cases = 0, bf16_cases = 0;
  size_t first_static = kinds.size();
  for (size_t r = 0; r < kinds.size(); ++r)
    if (kinds[r].activation.is_static() && first_static == kinds.size()) first_static = r;
  for (size_t r = 0; r < kinds.size(); ++r) {
    const auto& recipe = kinds[r];
    const bool is_static = recipe.activation.is_static();
    for (const auto& shape : shapes) {
      const auto [m, n, k] = std::tuple{shape[0], shape[1], shape[2]};
      // The large shape once with A scales and once without (its reference takes seconds).
      if (m == 2048 && r > 0 && r != first_static) continue;
      if (quick && ((r > 0 && r != first_static) || (m != 300 && m != 128 && m != 516))) continue;
      for (DType out : {DType::BF16, DType::F16}) {
        if (out == DType::F16 && m != 300) continue;
        // Prequantized E4M3 with the scales M-major on the device, or BF16 quantized by the library (static recipes;
        // the first recipe at M = 300 and 516, the library's own M-major scale buffer).
        const bool from_bf16 = is_static || (r == 0 && (m == 300 || m == 516));
        const int64_t groups = k / 128, ld = (m + 3) / 4 * 4;
        LinearCase c = make_case(recipe, m, n, k, DType::BF16, out, false);
        std::optional<MMajorScales> scales;
        if (!from_bf16) {
          prequantize(c, recipe.activation);
          scales.emplace(m_major_scales(c, m, groups, ld, 0.0f));
        }
        const TensorView* view = scales ? &scales->view : nullptr;
        static_cases += is_static;
        bf16_cases += from_bf16 && !is_static;
        Buffer general;
        {
          const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "128x128:1"), no_lean("FINEGEMM_GEMM_LEAN", "0");
          const long long launches = cuda::lean_gemm_launches();
          general = run_on_gpu(c.args, {}, view);
          EXPECT_EQ(cuda::lean_gemm_launches(), launches) << "FINEGEMM_GEMM_LEAN=0 still took the lean kernel";
        }
        const Buffer ref = run_reference(c.args, out, m, n);
        // Each height alone and in 2-CTA clusters sharing B (FINEGEMM_GEMM_LEAN_PAIR=1; an odd count of row blocks
        // leaves the last pair's second tile past M: at 128 rows M = 300 and 516, at 192 and 256 rows M = 516) or A
        // (=a; an odd count of column blocks leaves the last pair's second tile past N: N = 384, 640 and 2176).
        // Unset ("") the pair mode goes by shape (lean_pair_default: pairs sharing A at M = 2048, K = 1408 here).
        // Each with the B scales loaded by the consumers and by the scale warp (FINEGEMM_GEMM_LEAN_SFB_WARP=1).
        for (const char* sfb : {"0", "1"})
        for (const char* tiles : {"1", "192", "256"})
          for (const char* pair : {"0", "1", "a", ""}) {
          if (!*pair && m < 2048) continue;
          const ScopedEnv lean("FINEGEMM_GEMM_LEAN", tiles), paired("FINEGEMM_GEMM_LEAN_PAIR", pair),
              sfb_warp("FINEGEMM_GEMM_LEAN_SFB_WARP", sfb);
          const long long sfb_launches = cuda::lean_sfb_warp_launches();
          cuda::GemmParams shape_only;
          shape_only.m = static_cast<int>(m), shape_only.n = static_cast<int>(n), shape_only.k = static_cast<int>(k);
          const int mode = cuda::lean_pair_default(shape_only, cuda::lean_pair_mode());
          if (!*pair) EXPECT_EQ(mode, 2) << "unset FINEGEMM_GEMM_LEAN_PAIR at M=" << m << " K=" << k;
          const long long launches = cuda::lean_gemm_launches(), pairs_b = cuda::lean_pair_launches(false),
                          pairs_a = cuda::lean_pair_launches(true);
          const Buffer got = run_on_gpu(c.args, {}, view);
          EXPECT_EQ(cuda::lean_gemm_launches(), launches + 1)
              << "the lean kernel did not run: " << recipe.name << " M=" << m << " N=" << n << " K=" << k;
          EXPECT_EQ(cuda::lean_pair_launches(false), pairs_b + (mode == 1))
              << "FINEGEMM_GEMM_LEAN_PAIR=" << pair << ": pairs sharing B, M=" << m << " N=" << n << " lean=" << tiles;
          EXPECT_EQ(cuda::lean_sfb_warp_launches(), sfb_launches + (sfb[0] == '1'))
              << "FINEGEMM_GEMM_LEAN_SFB_WARP=" << sfb << ": the scale warp's launches, M=" << m << " lean=" << tiles;
          EXPECT_EQ(cuda::lean_pair_launches(true), pairs_a + (mode == 2))
              << "FINEGEMM_GEMM_LEAN_PAIR=" << pair << ": pairs sharing A, M=" << m << " N=" << n << " lean=" << tiles;
          EXPECT_EQ(got.bytes, general.bytes) << recipe.name << " M=" << m << " N=" << n << " K=" << k
                                              << " out=" << dtype_name(out) << " FINEGEMM_GEMM_LEAN=" << tiles
                                              << " FINEGEMM_GEMM_LEAN_PAIR=" << pair << " FINEGEMM_GEMM_LEAN_SFB_WARP=" << sfb
                                              << (from_bf16 ? " (BF16 input)" : "");
          const auto cmp = testing::compare(got, ref);
          EXPECT_EQ(cmp.non_finite, 0) << recipe.name << " M=" << m << " N=" << n << " K=" << k << " lean=" << tiles
                                       << " pair=" << pair;
          EXPECT_LE(cmp.rel, tolerance(out)) << recipe.name << " M=" << m << " N=" << n << " K=" << k << " lean=" << tiles
                                             << " pair=" << pair;
          }
      }
    }
  }
  // Quick: the first static recipe at M = 300 (BF16 and F16 out), 128 and 516; the full run takes every static recipe.
  EXPECT_GE(static_cases, quick ? 4 : 8) << "no static-activation case ran";
  EXPECT_GE(bf16_cases, 2) << "no case quantized by the library ran";
  // The default: 1024 x 4096 x 512 fills the GPU (128 tiles of 256 rows, 256 of 128) and takes the lean kernel; M = 16
  // (the decode kernel) and a forced general config do not.
  for (const auto& [m, n, k, want_lean, config] :
       {std::tuple<int64_t, int64_t, int64_t, bool, const char*>{1024, 4096, 512, true, ""},
        {16, 4096, 512, false, ""},
        {1024, 4096, 512, false, "128x128:1"}}) {
    const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", config);
    LinearCase c = make_case(kinds[0], m, n, k, DType::BF16, DType::BF16, false);
    const long long launches = cuda::lean_gemm_launches();
    const auto cmp = testing::compare(run_on_gpu(c.args), run_reference(c.args, DType::BF16, m, n));
    EXPECT_EQ(cuda::lean_gemm_launches(), launches + (want_lean ? 1 : 0)) << "M=" << m << " config='" << config << "'";
    EXPECT_EQ(cmp.non_finite, 0) << "M=" << m;
    EXPECT_LE(cmp.rel, tolerance(DType::BF16)) << "M=" << m;
  }
  const ScopedEnv bad("FINEGEMM_GEMM_LEAN", "128");  // the height is 1 for 128-row tiles
  LinearCase c = make_case(kinds[0], 300, 256, 512, DType::BF16, DType::BF16, false);
  EXPECT_THROW(run_on_gpu(c.args), Error);
}

// The scale warp's two B-scale buffers over many tiles per CTA (FINEGEMM_GEMM_LEAN_SFB_WARP=1, stop 44). Each buffer
// is refilled once the consumers release it, and its barriers wrap to parity 0 again from a CTA's fifth tile, so the
// shapes give every height five or more tiles per CTA (or per pair) on a 132-SM GPU: M = 2048 N = 16384 K = 128 is
// 2048 tiles of 128 rows, 1408 of 192 and 1024 of 256; M = 1024 N = 8192 K = 384 is 512 / 384 / 256 (checked against
// the CPU reference too); M = 2048 N = 4096 K = 4608 has 36 K blocks, so each lane of the scale warp stores two
// scales. Every height, alone and in pairs sharing B or A; the first recipe with 1x128 activations (BF16 input
// quantized by the library into its M-major scale buffer) and a static one. The same bits as the consumers' own loads
// (=0) and as the general kernel; the scale warp's launches counted. FINEGEMM_TEST_QUICK=1 (the sanitizers): the
// first recipe, 128 and 256 rows unpaired, the first two shapes.
TEST_F(CudaTest, LeanScaleWarpManyTiles) {
  const bool quick = std::getenv("FINEGEMM_TEST_QUICK") != nullptr;
  std::vector<NamedRecipe> kinds;
  for (const auto& r : all_recipes())
    if (r.weight.element != ElementType::FP4_E2M1 && r.weight.granularity == WeightGranularity::Block &&
        r.weight.block_n == 128 && r.weight.block_k == 128 &&
        ((r.activation.granularity == ActGranularity::PerTokenGroup && r.activation.group_size == 128 && kinds.empty()) ||
         (r.activation.is_static() && !quick)))
      kinds.push_back(r);
  ASSERT_FALSE(kinds.empty()) << "all_recipes() lost the block-128 recipe with 1x128 activations";
  struct Shape {
    int64_t m, n, k;
    bool reference;
  };
  const Shape shapes[] = {{2048, 16384, 128, false}, {1024, 8192, 384, true}, {2048, 4096, 4608, false}};
  for (size_t r = 0; r < kinds.size() && r < 2; ++r) {
    const auto& recipe = kinds[r];
    for (const Shape& shape : shapes) {
      if (quick && shape.k > 384) continue;
      const auto [m, n, k, with_ref] = shape;
      SCOPED_TRACE(recipe.name + " M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, false);
      Buffer general;
      {
        const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "128x128:1"), no_lean("FINEGEMM_GEMM_LEAN", "0");
        general = run_on_gpu(c.args);
      }
      std::optional<Buffer> ref;
      if (with_ref) {
        ref = run_reference(c.args, DType::BF16, m, n);
        EXPECT_LE(testing::compare(general, *ref).rel, tolerance(DType::BF16)) << "the general kernel";
      }
      for (const char* tiles : {"1", "192", "256"}) {
        if (quick && tiles[0] == '1' && tiles[1] == '9') continue;
        for (const char* pair : {"0", "1", "a"}) {
          if (quick && pair[0] != '0') continue;
          Buffer outs[2];
          for (int sfb = 0; sfb < 2; ++sfb) {
            const ScopedEnv lean("FINEGEMM_GEMM_LEAN", tiles), paired("FINEGEMM_GEMM_LEAN_PAIR", pair),
                sfb_warp("FINEGEMM_GEMM_LEAN_SFB_WARP", sfb ? "1" : "0");
            const long long launches = cuda::lean_gemm_launches(), sfb_launches = cuda::lean_sfb_warp_launches();
            outs[sfb] = run_on_gpu(c.args);
            EXPECT_EQ(cuda::lean_gemm_launches(), launches + 1) << "the lean kernel did not run, lean=" << tiles;
            EXPECT_EQ(cuda::lean_sfb_warp_launches(), sfb_launches + sfb) << "FINEGEMM_GEMM_LEAN_SFB_WARP=" << sfb;
          }
          EXPECT_EQ(outs[1].bytes, outs[0].bytes) << "lean=" << tiles << " pair=" << pair
                                                  << ": the scale warp's bits differ from the consumers' loads";
          EXPECT_EQ(outs[1].bytes, general.bytes) << "lean=" << tiles << " pair=" << pair
                                                  << ": not the general kernel's bits";
          if (ref) {
            const auto cmp = testing::compare(outs[1], *ref);
            EXPECT_EQ(cmp.non_finite, 0) << "lean=" << tiles << " pair=" << pair;
            EXPECT_LE(cmp.rel, tolerance(DType::BF16)) << "lean=" << tiles << " pair=" << pair;
          }
        }
      }
    }
  }
}

// The lean kernel's stream-K tail (FINEGEMM_GEMM_LEAN_STREAMK=1, stop 49): the whole waves' tiles run whole, the last
// partial wave's K blocks split evenly over the SMs, each tile stored by the CTA holding its last K block after it adds
// the partials of the CTAs below it. The shapes make every height split tiles in every way on a 132-SM GPU:
// M = 2048 N = 2176 K = 1408 leaves 4 tiles of 256 rows past one wave (44 K blocks: one CTA per K block, each tile
// over 11 CTAs), 55 of 192 (605 K blocks, 4-5 per CTA: tiles over 3-4 CTAs, a CTA finishing one tile and starting
// the next) and 8 of 128 (88 K blocks); M = 300 N = 1000 K = 1408 and M = 516 N = 384 K = 1280 are less than a wave
// (every tile in the tail; at M = 516 fewer K blocks than SMs); M = 4096 N = 1024 K = 7168 one tile short of a wave at
// 256 rows (54 or 55 K blocks per CTA of a tile's 56: nearly every tile over two CTAs). Against the CPU reference
// (the last shape against the general kernel, within the same tolerance), no non-finite value in a poisoned output,
// the same bits on a second run (the partials are added in a fixed order), its launch counted where a wave is partial,
// and captured in a graph and replayed twice (stream-ordered partials, the capture's flags); with
// FINEGEMM_GEMM_LEAN_STREAMK=2 (every tile whole) the plain lean kernel's bits. The first recipe with
// 1x128 activations and a static one; FINEGEMM_TEST_QUICK=1 (the sanitizers): the first recipe, the first two shapes.
TEST_F(CudaTest, LeanStreamKTail) {
  const bool quick = std::getenv("FINEGEMM_TEST_QUICK") != nullptr;
  std::vector<NamedRecipe> kinds;
  for (const auto& r : all_recipes())
    if (r.weight.element != ElementType::FP4_E2M1 && r.weight.granularity == WeightGranularity::Block &&
        r.weight.block_n == 128 && r.weight.block_k == 128 &&
        ((r.activation.granularity == ActGranularity::PerTokenGroup && r.activation.group_size == 128 && kinds.empty()) ||
         (r.activation.is_static() && !quick && kinds.size() == 1)))
      kinds.push_back(r);
  ASSERT_FALSE(kinds.empty()) << "all_recipes() lost the block-128 recipe with 1x128 activations";
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct Shape {
    int64_t m, n, k;
    bool reference;
  };
  const Shape shapes[] = {{2048, 2176, 1408, true}, {300, 1000, 1408, true}, {516, 384, 1280, true},
                          {4096, 1024, 7168, false}};
  int split_cases = 0;
  for (const auto& recipe : kinds) {
    for (const Shape& shape : shapes) {
      if (quick && shape.m != 2048 && shape.m != 300) continue;
      const auto [m, n, k, with_ref] = shape;
      SCOPED_TRACE(recipe.name + " M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, false);
      Buffer expect;
      if (with_ref) {
        expect = run_reference(c.args, DType::BF16, m, n);
      } else {
        const ScopedEnv forced("FINEGEMM_GEMM_CONFIG", "128x128:1"), no_lean("FINEGEMM_GEMM_LEAN", "0");
        expect = run_on_gpu(c.args);
      }
      for (const char* tiles : {"1", "192", "256"}) {
        if (quick && tiles[0] == '1' && tiles[1] == '9') continue;
        const int block_m = tiles[0] == '1' && tiles[1] == 0 ? 128 : std::atoi(tiles);
        const int64_t num_tiles = (m + block_m - 1) / block_m * ((n + 127) / 128);
        const bool tail = num_tiles % sms != 0;
        const ScopedEnv lean("FINEGEMM_GEMM_LEAN", tiles), stream_k("FINEGEMM_GEMM_LEAN_STREAMK", "1");
        const long long launches = cuda::lean_gemm_launches(), sk_launches = cuda::lean_stream_k_launches();
        const Buffer got = run_on_gpu(c.args);
        EXPECT_EQ(cuda::lean_gemm_launches(), launches + 1) << "the lean kernel did not run, lean=" << tiles;
        EXPECT_EQ(cuda::lean_stream_k_launches(), sk_launches + (tail ? 1 : 0))
            << "lean=" << tiles << ": " << num_tiles << " tiles on " << sms << " SMs";
        split_cases += tail;
        const auto cmp = testing::compare(got, expect);
        EXPECT_EQ(cmp.non_finite, 0) << "lean=" << tiles;
        EXPECT_LE(cmp.rel, tolerance(DType::BF16)) << "lean=" << tiles;
        EXPECT_EQ(run_on_gpu(c.args).bytes, got.bytes) << "lean=" << tiles << ": a second run's bits differ";
        if (shape.m == 2048 || shape.m == 516) {
          int replay = 0;
          for (const Buffer& again : run_captured(c.args, 2))
            EXPECT_EQ(again.bytes, got.bytes) << "lean=" << tiles << ": graph replay " << replay++;
        }
        // Mode 2 (diagnostics): the stream-K kernel with every tile whole gives the plain lean kernel's bits.
        Buffer plain, whole;
        {
          const ScopedEnv off("FINEGEMM_GEMM_LEAN_STREAMK", "0");
          plain = run_on_gpu(c.args);
        }
        {
          const ScopedEnv two("FINEGEMM_GEMM_LEAN_STREAMK", "2");
          const long long before = cuda::lean_stream_k_launches();
          whole = run_on_gpu(c.args);
          EXPECT_EQ(cuda::lean_stream_k_launches(), before + 1) << "lean=" << tiles << ": FINEGEMM_GEMM_LEAN_STREAMK=2";
        }
        EXPECT_EQ(whole.bytes, plain.bytes) << "lean=" << tiles << ": FINEGEMM_GEMM_LEAN_STREAMK=2 is not the plain bits";
      }
    }
  }
  EXPECT_GE(split_cases, quick ? 3 : 16) << "too few launches had a partial wave to split";
}

// RunOptions::weights_static with E4M3 activations: the decode kernel requests its first weight tiles before it waits
// for the kernel ahead (programmatic dependent launch, on by default for E4M3 weights). M = 1 and 16, without and with
// split-K, and M = 200 (the general kernel, which ignores the promise), against the CPU reference.
TEST_F(CudaTest, PreQuantizedActivationsWithStaticWeights) {
  const auto recipe = all_recipes()[0];  // block 128×128, group 128
  RunOptions options;
  options.weights_static = true;
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 512, 4096}, {16, 384, 1536}, {200, 256, 1024}}) {
    for (const char* split : {"", "1", "3"}) {
      const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
      LinearCase c = make_case(recipe, m, n, k, DType::BF16, DType::BF16, false);
      prequantize(c, recipe.activation);
      const Buffer ref = run_reference(c.args, DType::BF16, m, n);
      const auto cmp = testing::compare(run_on_gpu(c.args, options), ref);
      EXPECT_EQ(cmp.non_finite, 0) << "M=" << m << " split=" << split;
      EXPECT_LE(cmp.rel, tolerance(DType::BF16)) << "M=" << m << " split=" << split;
    }
  }
}

TEST_F(CudaTest, QuantizeActivationsBitExact) {
  struct Shape {
    int64_t m, k;
    DType dtype;
  };
  // 45x2048: whole blocks of vectors; 3x160 (60 vectors) and 7x384: a last block whose vectors are partly past the
  // end (the group kernel takes two vectors per thread); F32 and F16 inputs too.
  for (const Shape shape : {Shape{45, 2048, DType::BF16}, Shape{3, 160, DType::F32}, Shape{7, 384, DType::F16}}) {
  for (const auto& recipe : {ActivationRecipe::per_token_group(128), ActivationRecipe::per_token_group(32, true),
                             ActivationRecipe::per_token(), ActivationRecipe::static_per_tensor()}) {
    const int64_t m = shape.m, k = shape.k;
    if (recipe.granularity == ActGranularity::PerTokenGroup && k % recipe.group_size != 0) continue;
    Buffer x = testing::random_tensor(shape.dtype, {m, k});
    Buffer q_ref(DType::F8_E4M3, {m, k}), s_ref;
    s_ref = recipe.is_static() ? Buffer(DType::F32, {}) : Buffer(DType::F32, activation_scale_shape(recipe, m, k));
    if (recipe.is_static()) *s_ref.ptr<float>() = 3.0f / 448.0f;
    quantize_activations(x, recipe, q_ref, s_ref);

    auto dx = to_device(x, kGpu);
    Buffer q(DType::F8_E4M3, {m, k}), s(s_ref.view.dtype, s_ref.view.sizes());
    testing::poison(q);
    if (recipe.is_static()) *s.ptr<float>() = *s_ref.ptr<float>();
    else testing::poison(s);
    auto dq = to_device(q, kGpu), ds = to_device(s, kGpu);
    quantize_activations(dx.view, recipe, dq.view, ds.view);
    synchronize(kGpu);
    copy_to_host(dq.view, q);
    copy_to_host(ds.view, s);
    EXPECT_EQ(0, std::memcmp(q.bytes.data(), q_ref.bytes.data(), m * k)) << recipe.name() << " " << m << "x" << k;
    EXPECT_EQ(0, std::memcmp(s.bytes.data(), s_ref.bytes.data(), s.numel() * 4)) << recipe.name() << " " << m << "x" << k;

    // The FP4 decode kernel's K order (perm_k, FINEGEMM_FP4_DECODE_PERM=1: K % 128 == 0, groups of 128, per token or
    // static): the same codes with each 128-block permuted (fp4_perm_k_logical), the same scales.
    if (!cuda::quantize_perm_k_ok(recipe, k)) continue;
    Buffer qp(DType::F8_E4M3, {m, k}), sp(s_ref.view.dtype, s_ref.view.sizes());
    testing::poison(qp);
    if (recipe.is_static()) *sp.ptr<float>() = *s_ref.ptr<float>();
    else testing::poison(sp);
    auto dqp = to_device(qp, kGpu), dsp = to_device(sp, kGpu);
    cuda::launch_quantize_activations(dx.view.data, shape.dtype, m, k, recipe, dqp.view.ptr<uint8_t>(),
                                      dsp.view.ptr<float>(), nullptr, 0, true);
    synchronize(kGpu);
    copy_to_host(dqp.view, qp);
    copy_to_host(dsp.view, sp);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < m * k; ++i)
      mismatches += qp.bytes[i / 128 * 128 + cuda::fp4_perm_k_logical(static_cast<int>(i % 128))] != q_ref.bytes[i];
    EXPECT_EQ(mismatches, 0) << recipe.name() << " " << m << "x" << k << ": permuted codes";
    EXPECT_EQ(0, std::memcmp(sp.bytes.data(), s_ref.bytes.data(), sp.numel() * 4))
        << recipe.name() << " " << m << "x" << k << ": permuted launch's scales";
  }
  }
}

}  // namespace
}  // namespace finegemm
