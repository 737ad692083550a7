// The MoE block on the GPU against the CPU reference (which applies the same intermediate quantization), for every
// recipe; random routing with -1 slots, empty experts, one expert that takes every token; bit-for-bit determinism;
// capture of the whole layer in one CUDA graph; the lean grouped mode's bits against the general grouped kernel's,
// through the layer and with the grouped GEMM called directly. Skips itself when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.hpp"
#include "core/device_buffer.hpp"
#include "core/formats.hpp"
#include "cuda/runtime/gemm_args.hpp"
#include "cuda/runtime/moe.hpp"
#include "cuda/runtime/sm90_fp8_gemm.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

using tools::DeviceRun;
using tools::HostTensor;
using tools::MoeProblem;

class CudaMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

using testing::rng;  // seeded by FINEGEMM_TEST_SEED or fresh, printed (testing.hpp)

// Runs data on the GPU (poisoned output) and the reference; returns rel error and the GPU output.
// The bar of a GPU MoE output against the reference (issue 4): rel <= 1e-2. NOTE: at a5506f9..6f8fdc9 the skewed
// routing and the one-expert-in-chunks tests measured up to 1.65e-2 on the H200: they re-route token 1, which
// make_moe_inputs had routed nowhere and left with weights divided by 1e-6, so that one token was the whole output's
// norm and its few rounding flips the whole error (the other tokens went unchecked). make_moe_inputs no longer scales
// such weights; the CPU fast path with gate_up's scales perturbed by 1e-4 then gives median 3.2e-3, max 6.2e-3 over 40
// skewed cases (with the heavy token: max 1.11e-2).
constexpr double kMoeBar = 1e-2;

// How far the reference itself moves when gate_up's F32 weight scales move by `eps` relative (normal, per scale): the
// intermediate's requantization turns such differences into whole E4M3 codes, which weigh most where one token's
// output rests on a few large codes (T = 1, one scale per token over all of I). The largest of `draws` perturbations;
// 0 for scales that are not F32.
double reference_noise(const tools::MoeData& data, double eps, int draws) {
  if (data.gate_up.scale.view.dtype != DType::F32) return 0.0;
  HostTensor ref(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  moe_experts(data.args(ref.view), {Backend::Reference});
  std::normal_distribution<double> normal(0.0, 1.0);
  double worst = 0.0;
  for (int d = 0; d < draws; ++d) {
    tools::MoeData moved = data;
    auto* scale = static_cast<float*>(moved.gate_up.scale.view.data);
    for (int64_t i = 0; i < moved.gate_up.scale.view.numel(); ++i)
      scale[i] = static_cast<float>(scale[i] * (1.0 + eps * normal(rng())));
    HostTensor out(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
    moe_experts(moved.args(out.view), {Backend::Reference});
    worst = std::max(worst, tools::compare(out.view, ref.view).rel);
  }
  return worst;
}

// The block on the GPU into a poisoned output.
HostTensor run_on_gpu(const tools::MoeData& data) {
  HostTensor out(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  tools::poison(out.view);
  DeviceRun gpu(Backend::Cuda);
  MoeArgs args = gpu.upload(data.args(out.view));
  moe_experts(args, {Backend::Cuda});
  gpu.download(args.out, out.view);
  return out;
}

tools::Comparison run_and_compare(const tools::MoeData& data, HostTensor* gpu_out = nullptr) {
  HostTensor ref(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  moe_experts(data.args(ref.view), {Backend::Reference});
  const HostTensor out = run_on_gpu(data);
  if (gpu_out) *gpu_out = out;
  const auto cmp = tools::compare(out.view, ref.view);
  // FINEGEMM_TEST_PRINT_REL=1: every case's error, not only the failing ones' (its spread over seeds).
  if (std::getenv("FINEGEMM_TEST_PRINT_REL"))
    std::fprintf(stderr, "rel %.4e T=%lld H=%lld I=%lld E=%lld k=%lld %s\n", cmp.rel,
                 static_cast<long long>(data.problem.tokens), static_cast<long long>(data.problem.hidden),
                 static_cast<long long>(data.problem.inter), static_cast<long long>(data.problem.experts),
                 static_cast<long long>(data.problem.top_k), data.recipe.name.c_str());
  return cmp;
}

struct Variant {
  MoeActivation act;
  float limit;
  bool interleaved;
  bool bias;
};
// Both gate/up layouts, with and without a limit and a bias, and a no-gate activation.
const Variant kVariants[] = {{MoeActivation::SwiGLU, 0.0f, false, false},
                             {MoeActivation::SwiGLU, 7.0f, false, true},
                             {MoeActivation::SwiGLUOai, 7.0f, true, true},
                             {MoeActivation::Silu, 0.0f, false, false}};

// A small block (H = 256, 8 experts, top 4) in one activation variant.
// NOTE: one token's output rests on few E4M3 codes of the intermediate; a single rounding flip between the GPU's
// fp32 and the reference's double moved a T=1, I=256 output by 1.26%. A wider I at T = 1 keeps one flip under the
// 1e-2 bar (as in the CPU fast-path tests). The per-token GPU path, whose intermediate scale is one amax over all of I,
// reached 1.01e-2 at I = 1024 on the no-gate activations (H200, c4db43a): 2048.
MoeProblem small_problem(int64_t tokens, const Variant& v) {
  MoeProblem problem;
  problem.tokens = tokens;
  problem.hidden = 256;
  problem.inter = tokens == 1 ? 2048 : 256;
  problem.experts = 8;
  problem.top_k = 4;
  problem.activation = v.act;
  problem.swiglu_limit = v.limit;
  problem.interleaved = v.interleaved;
  problem.bias = v.bias;
  return problem;
}

// T = 300, top-8 over 16 experts (~150 rows each: expert ends inside the grouped GEMM's tiles of every height), hidden
// 640 (five 128-wide column blocks).
MoeProblem spread_problem(const Variant& v) {
  MoeProblem problem = small_problem(300, v);
  problem.experts = 16;
  problem.top_k = 8;
  problem.hidden = 640;
  return problem;
}

TEST_F(CudaMoe, EveryRecipeMatchesReference) {
  const auto& variants = kVariants;
  const auto recipes = all_recipes();
  for (size_t r = 0; r < recipes.size(); ++r) {
    const auto& recipe = recipes[r];
    // Two activation variants per recipe, rotating, so every variant meets every kind of recipe across the list.
    for (int64_t tokens : {1, 77, 300}) {
      for (const auto& v : {variants[r % 4], variants[(r + 1 + tokens) % 4]}) {
        const MoeProblem problem = small_problem(tokens, v);
        const auto masters = tools::make_moe_masters(rng(), problem);
        auto data = tools::make_moe(rng(), recipe, problem, masters);
        const auto cmp = run_and_compare(data);
        EXPECT_TRUE(cmp.ok(kMoeBar)) << recipe.name << " T=" << tokens << " " << problem.variant() << " rel=" << cmp.rel
                                  << " non-finite=" << cmp.non_finite;
      }
    }
  }
}

// Every recipe on the grouped path (the decode path off) with `env` set to each of `values`: T = 77 and 300 (or
// `token_counts`), the activation variants rotating over the recipes; output poisoned, checked against the reference.
// hidden > 0 replaces the small problem's hidden size (the down GEMM's N).
void every_recipe_on_grouped_path(const char* env, std::initializer_list<const char*> values,
                                  std::initializer_list<int64_t> token_counts = {77, 300}, int64_t hidden = 0) {
  const testing::ScopedEnv grouped("FINEGEMM_MOE_DECODE", "0");
  const auto recipes = all_recipes();
  for (const char* value : values) {
    SCOPED_TRACE(std::string(env) + "=" + value);
    const testing::ScopedEnv forced(env, value);
    for (size_t r = 0; r < recipes.size(); ++r) {
      for (int64_t tokens : token_counts) {
        MoeProblem problem = small_problem(tokens, kVariants[(r + tokens) % 4]);
        if (hidden > 0) problem.hidden = hidden;
        const auto masters = tools::make_moe_masters(rng(), problem);
        auto data = tools::make_moe(rng(), recipes[r], problem, masters);
        const auto cmp = run_and_compare(data);
        EXPECT_TRUE(cmp.ok(kMoeBar)) << recipes[r].name << " T=" << tokens << " " << problem.variant()
                                     << " rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
      }
    }
  }
}

// The gate_up unfused (the default: gate_up stores F32 on the Store path's tiles, then one pass applies the
// activation and requantizes the intermediate in groups or with the experts' static scales,
// moe_activation_quantize_kernel) and fused (FINEGEMM_MOE_UNFUSED=0: both in the GEMM's epilogue). Every recipe,
// every activation variant and both gate/up layouts.
TEST_F(CudaMoe, GateUpFusedAndUnfusedEveryRecipe) { every_recipe_on_grouped_path("FINEGEMM_MOE_UNFUSED", {"1", "0"}); }

// The grouped GEMM's forced tile heights (FINEGEMM_GROUPED_BLOCK_M): 64- and 128-row tiles, and 192-row tiles of three
// consumer warpgroups (the default from 48 rows per expert for E4M3 experts with 128-wide promotion or none; FP4 and
// 32-wide recipes fall back to 128). T = 77 (~38 rows per expert: one 192-row tile with two idle warpgroups) and 300
// (~150: the third warpgroup partly filled).
TEST_F(CudaMoe, GroupedTileHeightsEveryRecipe) {
  every_recipe_on_grouped_path("FINEGEMM_GROUPED_BLOCK_M", {"64", "128", "192"});
}

// The expert outputs y in BF16 (FINEGEMM_MOE_Y=bf16; by default FP32 while y stays under 1 GiB, so that the BF16 y
// of large prefills runs here too) and forced FP32.
TEST_F(CudaMoe, ExpertOutputsBf16AndF32EveryRecipe) { every_recipe_on_grouped_path("FINEGEMM_MOE_Y", {"bf16", "f32"}); }

// Each expert's tiles n-block major (FINEGEMM_GROUPED_ORDER=n, off by default). 64-row tiles forced, so that the
// experts of T = 300 (~150 rows) span three m-blocks and the order differs from the default's.
TEST_F(CudaMoe, GroupedNMajorOrderEveryRecipe) {
  const testing::ScopedEnv short_tiles("FINEGEMM_GROUPED_BLOCK_M", "64");
  every_recipe_on_grouped_path("FINEGEMM_GROUPED_ORDER", {"n"});
}

// 192-row grouped tiles in 2-CTA clusters sharing A (FINEGEMM_GROUPED_CLUSTER=1, off by default): the pair takes two
// adjacent column blocks of one expert's rows. 192-row tiles forced, so that T = 77 (experts of a few rows: idle
// warpgroups on both CTAs) runs them too; recipes that 192-row tiles do not serve fall back to 128 without clusters.
// H = 384 gives down three column blocks: the last pair's second CTA has no columns. Then with each expert's tiles
// n-block major at T = 900 (~450 rows per expert: three m-blocks, so the order differs from the default's).
TEST_F(CudaMoe, GroupedSharedAPairsEveryRecipe) {
  const testing::ScopedEnv tall("FINEGEMM_GROUPED_BLOCK_M", "192");
  every_recipe_on_grouped_path("FINEGEMM_GROUPED_CLUSTER", {"1"}, {77, 300}, 384);
  const testing::ScopedEnv pairs("FINEGEMM_GROUPED_CLUSTER", "1");
  every_recipe_on_grouped_path("FINEGEMM_GROUPED_ORDER", {"n"}, {900});
}

// Per-token activations through the GPU path (FINEGEMM_MOE_PER_TOKEN_GPU=1): gate_up stores F32 with the scales
// and bias applied, one kernel applies the activation, the per-token quantizer takes each row's amax over all of I,
// and down applies the routing weight. Every activation variant and both gate/up layouts; T = 1, 77, 300.
TEST_F(CudaMoe, PerTokenActivationsOnTheGpuPath) {
  setenv("FINEGEMM_MOE_PER_TOKEN_GPU", "1", 1);
  const Variant variants[] = {{MoeActivation::SwiGLU, 0.0f, false, false},
                              {MoeActivation::SwiGLU, 7.0f, false, true},
                              {MoeActivation::SwiGLUOai, 7.0f, true, true},
                              {MoeActivation::Silu, 0.0f, false, false},
                              {MoeActivation::Relu2, 0.0f, false, true}};
  int cases = 0;
  for (const auto& recipe : all_recipes()) {
    if (recipe.activation.granularity != ActGranularity::PerToken) continue;
    for (int64_t tokens : {1, 77, 300}) {
      for (const auto& v : variants) {
        const MoeProblem problem = small_problem(tokens, v);
        const auto masters = tools::make_moe_masters(rng(), problem);
        auto data = tools::make_moe(rng(), recipe, problem, masters);
        // The GPU kernels serve it (the host fallback would pass the comparison too).
        HostTensor probe(problem.out_dtype, {problem.tokens, problem.hidden});
        EXPECT_EQ(cuda::moe_gpu_path_refusal(data.args(probe.view), cuda::moe_per_token_gpu_enabled()), "")
            << recipe.name;
        const auto cmp = run_and_compare(data);
        // One token (T = 1) with one intermediate scale over all of I: a rounding flip of one of its few large codes
        // moves the whole output. The CPU fast path (exact to 1e-9 unperturbed) with gate_up's scales perturbed by
        // 1e-4 reached 1.36e-2 there (median 3.3e-3 over 15 cases); the H200 measured up to 1.63e-2. Its bar is the
        // larger of 1e-2 and twice the reference's own move under that perturbation (the largest of 6 draws; with 3
        // the bar stayed at 1e-2 for a 1.04e-2 case at stop 22).
        const double bar = tokens == 1 ? std::max(kMoeBar, 2.0 * reference_noise(data, 1e-4, 6)) : kMoeBar;
        EXPECT_TRUE(cmp.ok(bar)) << recipe.name << " T=" << tokens << " " << problem.variant() << " rel=" << cmp.rel
                                 << " bar=" << bar << " non-finite=" << cmp.non_finite;
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, 2 * 3 * 5) << "all_recipes() lost its per-token recipes";
  unsetenv("FINEGEMM_MOE_PER_TOKEN_GPU");
}

TEST_F(CudaMoe, SkewedRoutingEmptyExpertsAndOneExpertTakesAll) {
  struct Case {
    int64_t hidden, experts, top_k;
    bool duplicates;
  };
  // The full skew case, and neighbours that change one thing each (so a failure says which).
  for (const Case& cs : {Case{384, 16, 6, true}, Case{256, 16, 6, true}, Case{384, 8, 6, true}, Case{384, 16, 6, false},
                         Case{256, 8, 4, false}}) {
    for (const auto& recipe : {all_recipes()[0], all_recipes()[5]}) {
      MoeProblem problem;
      problem.tokens = 200;
      problem.hidden = cs.hidden;
      problem.inter = 256;
      problem.experts = cs.experts;
      problem.top_k = cs.top_k;
      const auto masters = tools::make_moe_masters(rng(), problem);
      auto data = tools::make_moe(rng(), recipe, problem, masters);
      tools::make_moe_inputs(rng(), data, true);
      // Expert 3 takes every token in slot 0; experts past 7 get nothing; some slots are skipped.
      auto* idx = data.top_k_index.ptr<int32_t>();
      ASSERT_EQ(data.top_k_index.view.dtype, DType::I32);
      const int64_t k = problem.top_k;
      for (int64_t t = 0; t < problem.tokens; ++t)
        for (int64_t j = 0; j < k; ++j) {
          int e = j == 0 ? 3 : (t % 5 == j ? -1 : static_cast<int>((t * 7 + j * 3) % 8));
          if (!cs.duplicates && j > 0 && e == 3) e = 4 + static_cast<int>(j % 4);
          if (!cs.duplicates)
            for (int64_t i = 1; i < j; ++i)
              if (idx[t * k + i] == e) e = -1;
          idx[t * k + j] = e;
        }
      HostTensor out;
      const auto cmp = run_and_compare(data, &out);
      std::string bad_tokens;
      for (int64_t t = 0, shown = 0; t < problem.tokens && shown < 6; ++t)
        for (int64_t h = 0; h < problem.hidden; ++h)
          if (!std::isfinite(tools::read_float(out.view, t * problem.hidden + h))) {
            bad_tokens += " t" + std::to_string(t) + "@" + std::to_string(h);
            ++shown;
            break;
          }
      EXPECT_TRUE(cmp.ok(kMoeBar)) << recipe.name << " H=" << cs.hidden << " E=" << cs.experts << " k=" << cs.top_k
                                << " dup=" << cs.duplicates << " rel=" << cmp.rel << " non-finite=" << cmp.non_finite
                                << " first bad tokens:" << bad_tokens;
    }
  }
}

// The down GEMM's lean Store epilogue (routing weights as row weights), its wide stores, and the gate_up kernel's
// idle-warpgroup skipping (T = 300 over 16 experts leaves partial 128-row tiles): the same bits with each switched
// away from its default, for bf16 and fp16 outputs, and within tolerance of the reference.
TEST_F(CudaMoe, LeanEpilogueAndIdleSkipSameBits) {
  for (DType out_dtype : {DType::BF16, DType::F16}) {
    MoeProblem problem;
    problem.tokens = 300;
    problem.hidden = 512;
    problem.inter = 256;
    problem.experts = 16;
    problem.top_k = 8;
    problem.out_dtype = out_dtype;
    const auto masters = tools::make_moe_masters(rng(), problem);
    auto data = tools::make_moe(rng(), all_recipes()[0], problem, masters);
    HostTensor on;
    const auto cmp = run_and_compare(data, &on);
    EXPECT_EQ(cmp.non_finite, 0) << dtype_name(out_dtype);
    EXPECT_LE(cmp.rel, 1e-2) << dtype_name(out_dtype);
    // Each switch away from its default (the wide stores, off on the grouped path: on; their F32 path runs in the
    // unfused gate_up).
    const std::pair<const char*, const char*> switches[] = {
        {"FINEGEMM_GEMM_LEAN_EPILOGUE", "0"}, {"FINEGEMM_GEMM_SKIP_IDLE", "0"}, {"FINEGEMM_GEMM_WIDE_STORES", "1"},
        {"FINEGEMM_GEMM_THREAD_RELEASE", "0"}};
    for (const auto& [env, value] : switches) {
      setenv(env, value, 1);
      HostTensor off;
      run_and_compare(data, &off);
      unsetenv(env);
      EXPECT_EQ(0, std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size())) << env << "=" << value << " "
                                                                                   << dtype_name(out_dtype);
    }
  }
}


// The TMA-store epilogue in the grouped Store GEMM (FINEGEMM_GROUPED_TMA_STORE=1, an experiment): the MoE down GEMM
// with BF16 expert outputs (FINEGEMM_MOE_Y=bf16), 128- and 192-row tiles. T = 300, top-8 over 16 experts (~150 rows
// each): expert ends fall inside warpgroups' 64-row slices, which take the lean store, and the rest TMA. Per recipe
// (those whose down GEMM it does not serve run the default unchanged): the TMA run of each tile height checked against
// the reference (computed once), and the same bits as the lean store.
// NOTE: at stop 33 a reference per run took 100 s on the H200 host; one per recipe, ~4x less.
TEST_F(CudaMoe, GroupedTmaStoreSameBits) {
  const testing::ScopedEnv grouped("FINEGEMM_MOE_DECODE", "0");
  const testing::ScopedEnv bf16_y("FINEGEMM_MOE_Y", "bf16");
  const auto recipes = all_recipes();
  for (size_t r = 0; r < recipes.size(); ++r) {
    const MoeProblem problem = spread_problem(kVariants[r % 4]);
    const auto masters = tools::make_moe_masters(rng(), problem);
    auto data = tools::make_moe(rng(), recipes[r], problem, masters);
    HostTensor ref(problem.out_dtype, {problem.tokens, problem.hidden});
    moe_experts(data.args(ref.view), {Backend::Reference});
    auto run_gpu = [&](const char* tma_store) {
      const testing::ScopedEnv tma("FINEGEMM_GROUPED_TMA_STORE", tma_store);
      return run_on_gpu(data);
    };
    for (const char* block_m : {"128", "192"}) {
      const testing::ScopedEnv tiles("FINEGEMM_GROUPED_BLOCK_M", block_m);
      const HostTensor on = run_gpu("1");
      const HostTensor off = run_gpu("0");
      const auto cmp = tools::compare(on.view, ref.view);
      EXPECT_TRUE(cmp.ok(kMoeBar)) << block_m << " " << recipes[r].name << " rel=" << cmp.rel
                                   << " non-finite=" << cmp.non_finite;
      EXPECT_EQ(0, std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size())) << block_m << " " << recipes[r].name;
    }
  }
}

// Whether the lean kernel's grouped mode serves a recipe's Store GEMMs (grouped_lean_ok): E4M3 experts with 128x128
// blocks (FP32, UE8M0 or packed UE8M0 scales), group-128 or static activations.
bool grouped_lean_serves(const NamedRecipe& recipe) {
  return recipe.weight.element != ElementType::FP4_E2M1 && recipe.weight.granularity == WeightGranularity::Block &&
         recipe.weight.block_n == 128 && recipe.weight.block_k == 128 &&
         ((recipe.activation.granularity == ActGranularity::PerTokenGroup && recipe.activation.group_size == 128) ||
          recipe.activation.is_static());
}

// The layer on the GPU with FINEGEMM_GROUPED_LEAN=0, then =128, 192 and 256, for FP32 and BF16 y (FINEGEMM_MOE_Y):
// the same bits each time; the lean launch counter still when off, and then moving by two (gate_up unfused and down)
// where `serves`, else still; each lean run within the reference's bar where `ref` is given.
void expect_grouped_lean_same_bits(const tools::MoeData& data, bool serves, const std::string& what,
                                   const HostTensor* ref) {
  auto run_gpu = [&](const char* lean) {
    const testing::ScopedEnv tiles("FINEGEMM_GROUPED_LEAN", lean);
    return run_on_gpu(data);
  };
  for (const char* y : {"f32", "bf16"}) {
    const testing::ScopedEnv y_dtype("FINEGEMM_MOE_Y", y);
    const long long before_off = cuda::grouped_lean_launches();
    const HostTensor off = run_gpu("0");
    EXPECT_EQ(cuda::grouped_lean_launches(), before_off) << what << " y=" << y << ": taken with FINEGEMM_GROUPED_LEAN=0";
    for (const char* lean : {"128", "192", "256"}) {
      const long long launches = cuda::grouped_lean_launches();
      const HostTensor on = run_gpu(lean);
      if (serves)
        EXPECT_EQ(cuda::grouped_lean_launches(), launches + 2)
            << "gate_up and down did not both take the lean kernel: " << what << " y=" << y << " lean=" << lean;
      else
        EXPECT_EQ(cuda::grouped_lean_launches(), launches) << what << " is not served, yet took it";
      EXPECT_EQ(0, std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size()))
          << what << " y=" << y << " FINEGEMM_GROUPED_LEAN=" << lean;
      if (ref) {
        const auto cmp = tools::compare(on.view, ref->view);
        EXPECT_TRUE(cmp.ok(kMoeBar)) << what << " y=" << y << " lean=" << lean << " rel=" << cmp.rel
                                     << " non-finite=" << cmp.non_finite;
      }
      // The tiles' A scales prefetched into L2 by the TMA thread (FINEGEMM_LEAN_SCALE_PREFETCH=1): a hint, the same
      // bits.
      if (serves) {
        const testing::ScopedEnv fetch("FINEGEMM_LEAN_SCALE_PREFETCH", "1");
        const HostTensor fetched = run_gpu(lean);
        EXPECT_EQ(0, std::memcmp(fetched.bytes.data(), off.bytes.data(), fetched.bytes.size()))
            << what << " y=" << y << " FINEGEMM_GROUPED_LEAN=" << lean << " FINEGEMM_LEAN_SCALE_PREFETCH=1";
      }
    }
  }
}

// The lean kernel's grouped mode (FINEGEMM_GROUPED_LEAN=128 / 192 / 256, off until measured on the GPU): the MoE
// layer's Store GEMMs (gate_up unfused with FP32 output; down with the routing weights, FP32 and BF16 y) give the
// general grouped kernel's bits on the recipes it serves (128x128 weight blocks with FP32, UE8M0 and packed UE8M0
// scales, group-128 and static activations), a launch counter proving it ran (gate_up and down), and the reference's
// bar; the other recipes run the general kernel unchanged. T = 300, top-8 over 16 experts (~150 rows each: expert ends
// inside tiles of every height), hidden 640 (five column blocks). An unknown value is refused.
TEST_F(CudaMoe, GroupedLeanSameBits) {
  const testing::ScopedEnv grouped("FINEGEMM_MOE_DECODE", "0");
  const auto recipes = all_recipes();
  int served = 0;
  for (size_t r = 0; r < recipes.size(); ++r) {
    const bool serves = grouped_lean_serves(recipes[r]);
    served += serves;
    // The variants without expert biases, SwiGLU and the no-gate SiLU (GroupedLeanBiasSameBits runs the biased ones).
    const MoeProblem problem = spread_problem(kVariants[(r % 2) * 3]);
    const auto masters = tools::make_moe_masters(rng(), problem);
    auto data = tools::make_moe(rng(), recipes[r], problem, masters);
    HostTensor ref(problem.out_dtype, {problem.tokens, problem.hidden});
    moe_experts(data.args(ref.view), {Backend::Reference});
    expect_grouped_lean_same_bits(data, serves, recipes[r].name, &ref);
  }
  EXPECT_GE(served, 7) << "all_recipes() lost the recipes the grouped lean kernel serves";
  const testing::ScopedEnv bad("FINEGEMM_GROUPED_LEAN", "64");
  MoeProblem problem = small_problem(300, kVariants[0]);
  const auto masters = tools::make_moe_masters(rng(), problem);
  const auto data = tools::make_moe(rng(), recipes[0], problem, masters);
  EXPECT_THROW(run_on_gpu(data), Error);
}

// A copy of an expert bias in `dtype` (the layer takes F32, BF16 and F16 biases).
HostTensor bias_as(const HostTensor& bias, DType dtype) {
  HostTensor out(dtype, bias.view.sizes());
  for (int64_t i = 0; i < bias.numel(); ++i) tools::write_float(out.view, i, tools::read_float(bias.view, i));
  return out;
}

// The grouped lean kernel by default (FINEGEMM_GROUPED_LEAN unset, stop 52): 192-row tiles from 256 rows per expert
// on average, 128-row tiles from 48 to 95 at K >= 4096 (stop 54), 192-row tiles from 96 where K or N >= 4096 (stop
// 58). T = 600, top-8 over 16 experts (~300 rows each): both Store GEMMs (gate_up unfused and down) take it, with the
// general kernel's bits (=0) and within the reference's bar; at T = 300 (~150 rows each, H = 640) neither does; at
// T = 200 (100 rows) with H = 4096 both do (gate_up's K and down's N are H); at T = 128 (64 rows) with H = 4096
// gate_up (K = H) does and down (K = I = 256) does not. Every
// recipe it serves, and one it does not (the general kernel, the same bits). FINEGEMM_GROUPED_BLOCK_M set keeps the
// general kernel.
TEST_F(CudaMoe, GroupedLeanByDefault) {
  const testing::ScopedEnv grouped("FINEGEMM_MOE_DECODE", "0"), unset("FINEGEMM_GROUPED_LEAN", "");
  const auto recipes = all_recipes();
  int served = 0, unserved = 0;
  for (size_t r = 0; r < recipes.size(); ++r) {
    const bool serves = grouped_lean_serves(recipes[r]);
    if (!serves && unserved++ > 0) continue;
    served += serves;
    for (const int64_t tokens : {600, 300, 200, 128}) {
      MoeProblem problem = spread_problem(kVariants[(r % 2) * 3]);
      problem.tokens = tokens;
      // H = 4096: gate_up's K reaches the 128-row band (48-95 rows per expert, K >= 4096: T = 128) and both GEMMs
      // the 192-row band from 96 rows (K or N >= 4096: T = 200, 100 rows; down's N is H).
      if (tokens == 128 || tokens == 200) problem.hidden = 4096;
      const auto masters = tools::make_moe_masters(rng(), problem);
      auto data = tools::make_moe(rng(), recipes[r], problem, masters);
      HostTensor ref(problem.out_dtype, {problem.tokens, problem.hidden});
      moe_experts(data.args(ref.view), {Backend::Reference});
      HostTensor off;
      {
        const testing::ScopedEnv forced_off("FINEGEMM_GROUPED_LEAN", "0");
        off = run_on_gpu(data);
      }
      const long long before = cuda::grouped_lean_launches();
      const HostTensor on = run_on_gpu(data);
      const int launches = !serves || tokens == 300 ? 0 : tokens == 600 || tokens == 200 ? 2 : 1;
      const bool taken = launches > 0;
      EXPECT_EQ(cuda::grouped_lean_launches() - before, launches)
          << recipes[r].name << " T=" << tokens << ": expected " << launches << " grouped lean launches";
      EXPECT_EQ(0, std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size()))
          << recipes[r].name << " T=" << tokens << ": not the general kernel's bits";
      const auto cmp = tools::compare(on.view, ref.view);
      EXPECT_TRUE(cmp.ok(kMoeBar)) << recipes[r].name << " T=" << tokens << " rel=" << cmp.rel
                                   << " non-finite=" << cmp.non_finite;
      if (taken) {  // a general-kernel setting keeps the general kernel
        const testing::ScopedEnv general("FINEGEMM_GROUPED_BLOCK_M", "192");
        const long long before_general = cuda::grouped_lean_launches();
        const HostTensor forced = run_on_gpu(data);
        EXPECT_EQ(cuda::grouped_lean_launches(), before_general)
            << recipes[r].name << ": taken with FINEGEMM_GROUPED_BLOCK_M set";
        EXPECT_EQ(0, std::memcmp(forced.bytes.data(), off.bytes.data(), off.bytes.size())) << recipes[r].name;
      }
    }
  }
  EXPECT_GE(served, 7) << "all_recipes() lost the recipes the grouped lean kernel serves";
  EXPECT_GE(unserved, 1) << "all_recipes() has no recipe the grouped lean kernel does not serve";
}

// GroupedLeanSameBits with expert biases (GPT-OSS), on the recipes the grouped lean mode serves: both biased
// activation variants (SwiGLU with a limit, and the interleaved SwiGLU-OAI), each with gate_up / down biases in
// F32 / F32, BF16 / F16 and F16 / BF16; FP32 and BF16 y; the same bits as the general kernel from every tile height
// (gate_up unfused adds its bias to FP32 output, down its bias before the routing weight), the launch counter moving
// by two (still when off), and the reference's bar on each recipe's first case. The layer's output is F32, so that
// y's last bits mostly reach it (the combine sums y in F32; GroupedLeanGemmSameBits compares y itself). Separate from
// GroupedLeanSameBits, which gpu-check also runs under compute-sanitizer.
TEST_F(CudaMoe, GroupedLeanBiasSameBits) {
  const testing::ScopedEnv grouped("FINEGEMM_MOE_DECODE", "0");
  struct Case {
    const Variant& variant;
    DType gate_up_bias, down_bias;
  };
  const Case cases[] = {{kVariants[1], DType::BF16, DType::F16}, {kVariants[2], DType::F16, DType::BF16},
                        {kVariants[1], DType::F32, DType::F32},  {kVariants[2], DType::F32, DType::F32},
                        {kVariants[1], DType::F16, DType::BF16}, {kVariants[2], DType::BF16, DType::F16}};
  int served = 0;
  for (const auto& recipe : all_recipes()) {
    if (!grouped_lean_serves(recipe)) continue;  // GroupedLeanSameBits checks that those run the general kernel
    ++served;
    bool first = true;
    for (const Case& c : cases) {
      MoeProblem problem = spread_problem(c.variant);
      problem.out_dtype = DType::F32;
      const auto masters = tools::make_moe_masters(rng(), problem);
      auto data = tools::make_moe(rng(), recipe, problem, masters);
      ASSERT_TRUE(data.gate_up_bias.view.defined() && data.down_bias.view.defined()) << problem.variant();
      data.gate_up_bias = bias_as(data.gate_up_bias, c.gate_up_bias);
      data.down_bias = bias_as(data.down_bias, c.down_bias);
      HostTensor ref;
      if (first) {
        ref = HostTensor(problem.out_dtype, {problem.tokens, problem.hidden});
        moe_experts(data.args(ref.view), {Backend::Reference});
      }
      expect_grouped_lean_same_bits(data, true,
                                    recipe.name + " " + problem.variant() + " biases " + dtype_name(c.gate_up_bias) +
                                        "/" + dtype_name(c.down_bias),
                                    first ? &ref : nullptr);
      first = false;
    }
  }
  EXPECT_GE(served, 7) << "all_recipes() lost the recipes the grouped lean kernel serves";
}

// ---- The grouped Store GEMM called directly (GroupedLeanGemmSameBits).
constexpr Device kGpu{DeviceType::CUDA, 0};

// A grouped Store GEMM's inputs: A [rows, K] E4M3 with 1x128 scales, B [E, N, K] E4M3 with 128x128 FP32 block scales,
// and what its epilogues read: per-token and per-expert activation scales (the A scales' alternatives), routing
// weights, an expert bias [E, N] (F32). Expert e owns rows [first[e], first[e] + counts[e]); every other row of A and
// of its scales and weights holds NaN (what an unfilled buffer may hold), and of y is never written.
struct GroupedGemmData {
  bool masked = false;
  int max_rows = 0;                          // masked: rows per expert
  std::vector<int32_t> counts, first;        // per expert
  std::vector<int32_t> groups;               // the layout's device array: offsets [E + 1] or counts [E] (masked)
  std::vector<int32_t> owner;                // per row: its expert, or -1
  int64_t experts = 0, rows = 0, n = 0, k = 0;
  HostTensor a, a_scale, token_scale, expert_scale, row_weight, bias;
  tools::QuantizedWeight b;
};

// Contiguous: experts of 0, 300, 1, 77, 128, 129, 0, 193 and 64 rows, then 19 rows past offsets[E] (moe.cu's scratch
// tail). Masked: 200 rows per expert, 0, 200, 1, 77, 128, 129, 193 and 64 of them used. Expert ends fall inside and at
// the edges of 128-, 192- and 256-row tiles.
GroupedGemmData make_grouped_gemm(bool masked, int64_t n, int64_t k) {
  GroupedGemmData g;
  g.masked = masked;
  g.n = n;
  g.k = k;
  g.counts = masked ? std::vector<int32_t>{0, 200, 1, 77, 128, 129, 193, 64}
                    : std::vector<int32_t>{0, 300, 1, 77, 128, 129, 0, 193, 64};
  g.experts = static_cast<int64_t>(g.counts.size());
  g.max_rows = masked ? 200 : 0;
  int32_t next = 0;
  for (int64_t e = 0; e < g.experts; ++e) {
    g.first.push_back(masked ? static_cast<int32_t>(e) * g.max_rows : next);
    next += g.counts[e];
  }
  g.groups = masked ? g.counts : g.first;
  if (!masked) g.groups.push_back(next);
  g.rows = masked ? g.experts * g.max_rows : next + 19;
  g.owner.assign(static_cast<size_t>(g.rows), -1);
  for (int64_t e = 0; e < g.experts; ++e)
    for (int32_t i = 0; i < g.counts[e]; ++i) g.owner[g.first[e] + i] = static_cast<int32_t>(e);

  const HostTensor x = tools::random_normal(rng(), DType::BF16, {g.rows, k}, 1.0f);
  g.a = HostTensor(DType::F8_E4M3, {g.rows, k});
  g.a_scale = HostTensor(DType::F32, {g.rows, k / 128});
  quantize_activations(x.view, ActivationRecipe::per_token_group(128), g.a.view, g.a_scale.view);
  const HostTensor master = tools::random_normal(rng(), DType::F32, {g.experts, n, k}, 1.0f / std::sqrt(float(k)));
  g.b = tools::quantize(master.view, WeightRecipe::block());
  // Per-token and static scales of the A scales' size (y of the size of the bias, so that a bias left out shows),
  // spread over two binades.
  std::uniform_real_distribution<float> spread(0.5f, 2.0f), weight(0.25f, 1.0f);
  g.token_scale = HostTensor(DType::F32, {g.rows});
  g.row_weight = HostTensor(DType::F32, {g.rows});
  for (int64_t r = 0; r < g.rows; ++r) {
    g.token_scale.ptr<float>()[r] = g.a_scale.ptr<float>()[r * (k / 128)] * spread(rng());
    g.row_weight.ptr<float>()[r] = weight(rng());
  }
  g.expert_scale = HostTensor(DType::F32, {g.experts});
  for (int64_t e = 0; e < g.experts; ++e) g.expert_scale.ptr<float>()[e] = g.a_scale.ptr<float>()[0] * spread(rng());
  g.bias = tools::random_normal(rng(), DType::F32, {g.experts, n}, 0.5f);
  // Rows no expert owns: NaN codes and scales.
  for (int64_t r = 0; r < g.rows; ++r) {
    if (g.owner[r] >= 0) continue;
    std::memset(g.a.bytes.data() + r * k, 0x7F, static_cast<size_t>(k));
    for (int64_t j = 0; j < k / 128; ++j) g.a_scale.ptr<float>()[r * (k / 128) + j] = NAN;
    g.token_scale.ptr<float>()[r] = NAN;
    g.row_weight.ptr<float>()[r] = NAN;
  }
  return g;
}

// The owned rows' products before the epilogue, in double: Σ_kb a_scale[r, kb] · b_scale[e, n / 128, kb] ·
// Σ_{k in kb} a[r, k] · b[e, n, k] (with_a_scale false: no A scale, as for per-token and static activations); 0 for
// rows no expert owns.
std::vector<double> grouped_products(const GroupedGemmData& g, bool with_a_scale) {
  const int64_t kb_count = g.k / 128, scale_rows = (g.n + 127) / 128;
  std::vector<float> a(static_cast<size_t>(g.rows * g.k)), b(static_cast<size_t>(g.experts * g.n * g.k));
  for (size_t i = 0; i < a.size(); ++i) a[i] = fmt::e4m3_to_float(g.a.bytes[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = fmt::e4m3_to_float(g.b.weight.bytes[i]);
  const float* b_scale = g.b.scale.ptr<float>();
  std::vector<double> out(static_cast<size_t>(g.rows * g.n), 0.0);
  for (int64_t r = 0; r < g.rows; ++r) {
    const int64_t e = g.owner[r];
    if (e < 0) continue;
    for (int64_t col = 0; col < g.n; ++col) {
      double sum = 0.0;
      for (int64_t kb = 0; kb < kb_count; ++kb) {
        double block = 0.0;
        for (int64_t i = kb * 128; i < kb * 128 + 128; ++i)
          block += double(a[r * g.k + i]) * double(b[(e * g.n + col) * g.k + i]);
        const double a_scale = with_a_scale ? g.a_scale.ptr<float>()[r * kb_count + kb] : 1.0;
        sum += block * a_scale * b_scale[(e * scale_rows + col / 128) * kb_count + kb];
      }
      out[r * g.n + col] = sum;
    }
  }
  return out;
}

// A grouped Store GEMM's y (any output dtype) against the reference: on the owned rows (v · rs + bias) · w, with v
// from grouped_products, rs the per-token or the expert's static scale (1 with group scales), the bias as `bias`
// holds it (nullptr: none) and w the routing weight (1 unless weighted), within RECIPES.md's bar (rel 1e-3 for F32,
// 3e-3 for 16-bit y); every other row still poisoned, byte for byte.
void expect_grouped_y(const GroupedGemmData& g, const std::vector<double>& products, const ActivationRecipe& act,
                      const HostTensor* bias, bool weighted, const HostTensor& y) {
  const int64_t n = g.n;
  const DType out_dtype = y.view.dtype;
  HostTensor poisoned(out_dtype, {g.rows, n});
  tools::poison(poisoned.view);
  const size_t row_bytes = static_cast<size_t>(n) * dtype_size(out_dtype);
  std::vector<float> got, want;
  int64_t written_unowned = 0;
  for (int64_t r = 0; r < g.rows; ++r) {
    const int64_t e = g.owner[r];
    if (e < 0) {
      written_unowned +=
          std::memcmp(y.bytes.data() + r * row_bytes, poisoned.bytes.data() + r * row_bytes, row_bytes) != 0;
      continue;
    }
    const double rs = act.granularity == ActGranularity::PerToken ? g.token_scale.ptr<float>()[r]
                      : act.is_static()                           ? g.expert_scale.ptr<float>()[e]
                                                                  : 1.0;
    const double w = weighted ? g.row_weight.ptr<float>()[r] : 1.0;
    for (int64_t col = 0; col < n; ++col) {
      const double add = bias ? tools::read_float(bias->view, e * n + col) : 0.0;
      got.push_back(tools::read_float(y.view, r * n + col));
      want.push_back(static_cast<float>((products[r * n + col] * rs + add) * w));
    }
  }
  EXPECT_EQ(written_unowned, 0) << "rows no expert owns were written";
  const int64_t owned = static_cast<int64_t>(got.size()) / n;
  const auto cmp = tools::compare(TensorView::of(got.data(), DType::F32, {owned, n}),
                                  TensorView::of(want.data(), DType::F32, {owned, n}));
  EXPECT_TRUE(cmp.ok(out_dtype == DType::F32 ? 1e-3 : 3e-3))
      << "y against the reference: rel=" << cmp.rel << " non-finite=" << cmp.non_finite;
}

// The lean kernel's grouped mode against the general grouped kernel, called directly (launch_sm90_fp8_grouped_gemm)
// with the Store epilogues the MoE layer does not reach: y in F16, N not a multiple of 128 (the layer takes H and I
// multiples of 128), the masked layout (the layer and the expert-parallel layer pass offsets), next to the ones it
// does: y in F32 and BF16, no bias or an expert bias in F32, BF16 or F16, routing weights or none, group-128, per-token
// and static activation scales; contiguous and masked layouts with expert ends inside and at the edges of the tiles,
// rows no expert owns holding NaN in A. Each FINEGEMM_GROUPED_LEAN height gives y byte for byte as
// FINEGEMM_GROUPED_LEAN=0 (the general kernel: 192-row tiles for the contiguous layout's ~100 rows per expert, 64-row
// tiles for the masked layout's expected 16), into a poisoned y, with the launch counter moving by one (zero when off);
// the general kernel's y is checked against a double reference (rel 1e-3 for F32, 3e-3 for 16-bit y, RECIPES.md) and
// leaves the rows no expert owns poisoned. K = 640: five K blocks, so the last lap pads stages at every stage count.
TEST_F(CudaMoe, GroupedLeanGemmSameBits) {
  const int64_t k = 640;
  const ActivationRecipe acts[] = {ActivationRecipe::per_token_group(128), ActivationRecipe::per_token(),
                                   ActivationRecipe::static_per_tensor()};
  const DType bias_dtypes[] = {DType::F32, DType::BF16, DType::F16};
  int lean_runs = 0;
  for (bool masked : {false, true}) {
    for (int64_t n : {384, 200, 130}) {
      const GroupedGemmData g = make_grouped_gemm(masked, n, k);
      const std::vector<double> with_a_scale = grouped_products(g, true), without = grouped_products(g, false);
      const DeviceTensor a = to_device(g.a.view, kGpu), a_scale = to_device(g.a_scale.view, kGpu),
                         b = to_device(g.b.weight.view, kGpu), b_scale = to_device(g.b.scale.view, kGpu),
                         token_scale = to_device(g.token_scale.view, kGpu),
                         expert_scale = to_device(g.expert_scale.view, kGpu),
                         row_weight = to_device(g.row_weight.view, kGpu),
                         groups = to_device(TensorView::of(g.groups.data(), DType::I32,
                                                           {static_cast<int64_t>(g.groups.size())}),
                                            kGpu);
      std::vector<HostTensor> host_bias;
      std::vector<DeviceTensor> bias;
      for (DType d : bias_dtypes) {
        host_bias.push_back(bias_as(g.bias, d));
        bias.push_back(to_device(host_bias.back().view, kGpu));
      }
      cuda::GroupedLayout layout;
      if (masked) {
        layout.counts = groups.view.ptr<const int32_t>();
        layout.max_rows = g.max_rows;
      } else {
        layout.offsets = groups.view.ptr<const int32_t>();
      }
      layout.num_groups = static_cast<int>(g.experts);
      layout.expected_rows_per_group = masked ? 16 : g.rows / g.experts;
      for (const ActivationRecipe& act : acts) {
        const bool group_scales = act.granularity == ActGranularity::PerTokenGroup;
        const std::vector<double>& products = group_scales ? with_a_scale : without;
        for (int bias_kind = -1; bias_kind < 3; ++bias_kind) {  // -1: no bias, else bias_dtypes[bias_kind]
          for (DType out_dtype : {DType::F32, DType::BF16, DType::F16}) {
            for (bool weighted : {false, true}) {
              const std::string what = std::string(masked ? "masked" : "contiguous") + " N=" + std::to_string(n) +
                                       " " + act.name() + " bias " +
                                       (bias_kind < 0 ? "none" : dtype_name(bias_dtypes[bias_kind])) + " y " +
                                       dtype_name(out_dtype) + (weighted ? " routing weights" : "");
              SCOPED_TRACE(what);
              cuda::GemmParams p;
              p.m = static_cast<int>(g.rows);
              p.n = static_cast<int>(n);
              p.k = static_cast<int>(k);
              const int promote_k = cuda::promotion_k(WeightRecipe::block(), act);
              p.promote_k = promote_k == 0 ? 128 : promote_k;
              const float* x_scale = group_scales ? a_scale.view.ptr<const float>()
                                                  : (act.is_static() ? nullptr : token_scale.view.ptr<const float>());
              cuda::set_activation_scales(p, act, x_scale, k / 128, 1, k, expert_scale.view.ptr<const float>());
              cuda::set_weight_scales(p, WeightRecipe::block(), b_scale.view, n, k);
              if (bias_kind >= 0) cuda::set_bias(p, bias[bias_kind].view, n);
              if (weighted) p.row_weight = row_weight.view.ptr<const float>();
              p.out_dtype = cuda::out_dtype_of(out_dtype);
              p.ldo = n;
              // y poisoned before every run: a run that leaves an element unwritten cannot inherit another's.
              auto run = [&](const char* lean) {
                const testing::ScopedEnv forced("FINEGEMM_GROUPED_LEAN", lean);
                HostTensor y(out_dtype, {g.rows, n});
                tools::poison(y.view);
                const DeviceTensor d_y = to_device(y.view, kGpu);
                cuda::GemmParams q = p;
                q.out = d_y.view.data;
                const long long before = cuda::grouped_lean_launches();
                cuda::launch_sm90_fp8_grouped_gemm(a.view.data, k, b.view.data, k, layout, cuda::Epilogue::Store, q,
                                                   nullptr);
                EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "FINEGEMM_GROUPED_LEAN=" << lean;
                EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "FINEGEMM_GROUPED_LEAN=" << lean;
                EXPECT_EQ(cuda::grouped_lean_launches() - before, std::strcmp(lean, "0") == 0 ? 0 : 1)
                    << "FINEGEMM_GROUPED_LEAN=" << lean << ": lean launches";
                copy_to_host(d_y.view, y.view);
                return y;
              };
              const HostTensor off = run("0");
              expect_grouped_y(g, products, act, bias_kind < 0 ? nullptr : &host_bias[bias_kind], weighted, off);
              for (const char* lean : {"128", "192", "256"}) {
                const HostTensor on = run(lean);
                ++lean_runs;
                EXPECT_EQ(0, std::memcmp(on.bytes.data(), off.bytes.data(), on.bytes.size()))
                    << "FINEGEMM_GROUPED_LEAN=" << lean << " vs 0";
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(lean_runs, 2 * 3 * 3 * 4 * 3 * 2 * 3);
}

using testing::ScopedEnv;

// Which path the MoE block takes (host-side choice, no GPU needed: runs in CI): the decode path for every FP4
// recipe and every block recipe whose scales hold over 128 of K, at decode sizes only (up to 16 rows per expert, 32
// with FP4 experts), never for per-tensor / per-channel weights or group-32 activations with E4M3 weights;
// FINEGEMM_MOE_DECODE=0 / 1.
TEST(MoePathChoice, DecodePathForItsRecipesAtDecodeSizes) {
  auto recipes = all_recipes();
  recipes.push_back({"block x token", WeightRecipe::block(128, 128, ScaleFormat::FP32), ActivationRecipe::per_token()});
  int decode_recipes = 0;
  for (const auto& recipe : recipes) {
    const bool fp4 = recipe.weight.element == ElementType::FP4_E2M1;
    const bool served = fp4 || (recipe.weight.granularity == WeightGranularity::Block &&
                                !(recipe.activation.granularity == ActGranularity::PerTokenGroup &&
                                  recipe.activation.group_size % 128 != 0));
    MoeProblem problem;
    problem.tokens = 4;
    problem.experts = 8;
    problem.top_k = 4;
    const auto masters = tools::make_moe_masters(rng(), problem);
    const auto data = tools::make_moe(rng(), recipe, problem, masters);
    HostTensor probe(problem.out_dtype, {problem.tokens, problem.hidden});
    const MoeArgs args = data.args(probe.view);
    EXPECT_EQ(cuda::moe_decode_path(args, 16), served) << recipe.name;           // 2 rows per expert
    const int64_t edge = (fp4 ? 32 : 16) * 8;  // rows per expert at the default's edge: 32 for FP4, 16 for E4M3
    EXPECT_EQ(cuda::moe_decode_path(args, edge), served) << recipe.name;
    EXPECT_FALSE(cuda::moe_decode_path(args, edge + 1)) << recipe.name;  // beyond it
    {
      const ScopedEnv off("FINEGEMM_MOE_DECODE", "0");
      EXPECT_FALSE(cuda::moe_decode_path(args, 16)) << recipe.name;
    }
    {
      const ScopedEnv on("FINEGEMM_MOE_DECODE", "1");
      EXPECT_EQ(cuda::moe_decode_path(args, 100000), served) << recipe.name;
    }
    decode_recipes += served;
  }
  EXPECT_GE(decode_recipes, 13);
}

// The decode path (moe_decode.cuh + the decode kernel over the experts with rows): every recipe it serves, with its
// split-K as the heuristic picks it and forced to 1 and 3, against the reference. T = 1 (down has 2048 of K: the
// heuristic splits it), 5 (20 rows over 8 experts: chunks of 8 rows for the fullest) and 24 (96 rows). Every FP4 recipe and the FP8 block recipes whose activation scales hold over
// 128 of K must take it.
// Decode-path launch settings the tests run: FINEGEMM_FP4_DECODE_SPLIT (none, forced 1, forced 3) and FINEGEMM_PDL.
constexpr std::pair<const char*, const char*> kSplitsAndPdl[] = {{"", ""}, {"1", ""}, {"3", ""}, {"", "1"}, {"3", "1"}};
// DecodePathEveryServedRecipe adds the loader's weight tiles two or three stages at a time
// (FINEGEMM_DECODE_LOAD_BATCH) with each split.
struct DecodeLaunch {
  const char* split;
  const char* pdl;
  const char* batch;
};
constexpr DecodeLaunch kDecodeLaunches[] = {{"", "", ""}, {"1", "", ""}, {"3", "", ""}, {"", "1", ""},
                                            {"3", "1", ""}, {"", "", "2"}, {"1", "", "3"}, {"3", "", "2"}};

TEST_F(CudaMoe, DecodePathEveryServedRecipe) {
  const Variant variants[] = {{MoeActivation::SwiGLU, 0.0f, false, false},
                              {MoeActivation::SwiGLU, 7.0f, false, true},
                              {MoeActivation::SwiGLUOai, 7.0f, true, true},
                              {MoeActivation::Silu, 0.0f, false, false},
                              {MoeActivation::Relu2, 0.0f, false, true}};
  const ScopedEnv decode("FINEGEMM_MOE_DECODE", "1");
  auto recipes = all_recipes();
  // Per-token activations with block and MX weights: valid pairs that only the decode path serves on the GPU (the
  // intermediate's per-row scale, one block per row).
  for (const auto& [w, a] : {std::pair{WeightRecipe::block(128, 128, ScaleFormat::FP32), ActivationRecipe::per_token()},
                             std::pair{WeightRecipe::mxfp4(ScaleFormat::UE8M0), ActivationRecipe::per_token(true)}})
    recipes.push_back({w.name() + " x " + a.name(), w, a});
  int served = 0;
  for (size_t r = 0; r < recipes.size(); ++r) {
    const auto& recipe = recipes[r];
    const bool fp4 = recipe.weight.element == ElementType::FP4_E2M1;
    const bool want = fp4 || (recipe.weight.granularity == WeightGranularity::Block && recipe.weight.block_k % 128 == 0 &&
                              recipe.weight.block_n % 64 == 0 &&
                              !(recipe.activation.granularity == ActGranularity::PerTokenGroup &&
                                recipe.activation.group_size % 128 != 0));
    for (int64_t tokens : {1, 5, 24}) {
      const Variant& v = variants[(r + static_cast<size_t>(tokens)) % 5];
      const MoeProblem problem = small_problem(tokens, v);
      const auto masters = tools::make_moe_masters(rng(), problem);
      auto data = tools::make_moe(rng(), recipe, problem, masters);
      HostTensor probe(problem.out_dtype, {problem.tokens, problem.hidden});
      const bool taken = cuda::moe_decode_path(data.args(probe.view), tokens * problem.top_k);
      EXPECT_EQ(taken, want) << recipe.name;
      if (!taken) continue;
      ++served;
      // Splits (none, forced 1, forced 3), and programmatic dependent launch of the expert GEMMs (FINEGEMM_PDL=1:
      // down requests its first weights before it waits for the activation kernel).
      // The intermediate is quantized again (FP8, one scale per group of the activation): a rounding flip of one
      // of a few tokens' large codes moves the output past 1e-2 (stop 22, seed 3887976572863531662: relu2, group128
      // pow2, T = 5, 1.2e-2 from every split and launch setting alike). Past kMoeBar the bar is, as in
      // PerTokenActivationsOnTheGpuPath, twice the reference's own move under a 1e-4 perturbation of gate_up's scales.
      double noise = -1.0;
      for (const auto& [split, pdl, batch] : kDecodeLaunches) {
        const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
        const ScopedEnv programmatic("FINEGEMM_PDL", pdl);
        const ScopedEnv batched("FINEGEMM_DECODE_LOAD_BATCH", batch);
        const auto cmp = run_and_compare(data);
        if (!cmp.ok(kMoeBar) && noise < 0.0) noise = reference_noise(data, 1e-4, 6);
        const double bar = std::max(kMoeBar, 2.0 * noise);
        EXPECT_TRUE(cmp.ok(bar)) << recipe.name << " T=" << tokens << " split=" << split << " pdl=" << pdl
                                 << " load batch=" << batch << " " << problem.variant() << " rel=" << cmp.rel
                                 << " bar=" << bar << " non-finite=" << cmp.non_finite;
      }
    }
  }
  EXPECT_GE(served, 3 * 13) << "the decode path served fewer recipes than expected";
}

// The layer captured in one CUDA graph on a fresh stream (after one eager warm-up call on it with warm_up), replayed
// `replays` times, each into an output poisoned on the device first; the host outputs of every replay.
// finishes_captured: the decode launches captured that finish their split-K in the kernel.
std::vector<HostTensor> captured_replays(const tools::MoeData& data, int replays, bool warm_up,
                                         long long* finishes_captured = nullptr) {
  HostTensor out(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  DeviceRun gpu(Backend::Cuda);
  MoeArgs args = gpu.upload(data.args(out.view));
  std::vector<HostTensor> outs;
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  if (warm_up) {
    moe_experts(args, {Backend::Cuda, stream});
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const long long finishes = cuda::decode_split_finishes();
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  moe_experts(args, {Backend::Cuda, stream});
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (finishes_captured) *finishes_captured = cuda::decode_split_finishes() - finishes;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int r = 0; r < replays; ++r) {
    EXPECT_EQ(cudaMemsetAsync(args.out.data, 0xFF, out.view.numel() * dtype_size(out.view.dtype), stream), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    gpu.download(args.out, out.view);
    outs.push_back(out);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return outs;
}

// 24 tokens, top-2 over 64 experts, every token's first slot on expert 5 (24 rows: it runs in chunks of the decode
// kernel's token width), the second spread over experts 6..63.
tools::MoeData one_expert_in_chunks(const NamedRecipe& recipe) {
  MoeProblem problem;
  problem.tokens = 24;
  problem.hidden = 512;
  problem.inter = 1024;
  problem.experts = 64;
  problem.top_k = 2;
  const auto masters = tools::make_moe_masters(rng(), problem);
  auto data = tools::make_moe(rng(), recipe, problem, masters);
  tools::make_moe_inputs(rng(), data, true);
  EXPECT_EQ(data.top_k_index.view.dtype, DType::I32);
  auto* idx = data.top_k_index.ptr<int32_t>();
  for (int64_t t = 0; t < problem.tokens; ++t) {
    idx[t * 2] = 5;
    idx[t * 2 + 1] = static_cast<int32_t>(6 + (t * 7) % 58);
  }
  return data;
}

// The decode path when one expert takes far more rows than its token tiles hold: every token's first slot goes to
// expert 5, so that expert runs 24 rows in chunks of 8 (the others hold one or two rows); with and without a
// split.
TEST_F(CudaMoe, DecodePathOneExpertInChunks) {
  const ScopedEnv decode("FINEGEMM_MOE_DECODE", "1");
  for (const auto& recipe : {all_recipes()[0], all_recipes()[5]}) {
    auto data = one_expert_in_chunks(recipe);
    const MoeProblem& problem = data.problem;
    HostTensor probe(problem.out_dtype, {problem.tokens, problem.hidden});
    if (!cuda::moe_decode_path(data.args(probe.view), problem.tokens * problem.top_k)) continue;
    for (const auto& [split, pdl] : kSplitsAndPdl) {
      const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", split);
      const ScopedEnv programmatic("FINEGEMM_PDL", pdl);
      const auto cmp = run_and_compare(data);
      EXPECT_TRUE(cmp.ok(kMoeBar)) << recipe.name << " split=" << split << " pdl=" << pdl << " rel=" << cmp.rel
                                << " non-finite=" << cmp.non_finite;
    }
  }
}

// The decode path's split-K finished by each weight tile's last CTA (FINEGEMM_DECODE_SPLIT_FINISH=1) instead of the
// reduce kernel: the same bits, for every recipe the decode path serves, with forced splits (gate_up K = 512 in 2,
// down K = 1024 in 3), with and without programmatic launches, and one expert in chunks (24 rows, chunks of 8 or 16).
// Three eager runs in a row, each into a poisoned y (a counter left non-zero by one call would leave the next call's
// tiles unfinished), a launch counter proving both GEMMs took it, then the layer captured in one graph and replayed
// three times into a poisoned y. FINEGEMM_TEST_QUICK=1 (the sanitizer runs): the first E4M3 and FP4 recipes only.
TEST_F(CudaMoe, DecodeSplitFinishSameBits) {
  const ScopedEnv decode("FINEGEMM_MOE_DECODE", "1");
  const ScopedEnv forced("FINEGEMM_FP4_DECODE_SPLIT", "3");
  const bool quick = std::getenv("FINEGEMM_TEST_QUICK") != nullptr;
  int served = 0, ran[2] = {0, 0};  // ran: E4M3, FP4 experts
  for (const auto& recipe : all_recipes()) {
    auto data = one_expert_in_chunks(recipe);
    const MoeProblem& problem = data.problem;
    HostTensor probe(problem.out_dtype, {problem.tokens, problem.hidden});
    if (!cuda::moe_decode_path(data.args(probe.view), problem.tokens * problem.top_k)) continue;
    ++served;
    const int fp4 = recipe.weight.element == ElementType::FP4_E2M1 ? 1 : 0;
    if (quick && ran[fp4] > 0) continue;
    ++ran[fp4];
    for (const char* pdl : {"0", "1"}) {
      const ScopedEnv programmatic("FINEGEMM_PDL", pdl);
      HostTensor reduced;
      {
        const ScopedEnv off("FINEGEMM_DECODE_SPLIT_FINISH", "0");
        const long long before = cuda::decode_split_finishes();
        const auto cmp = run_and_compare(data, &reduced);
        EXPECT_TRUE(cmp.ok(kMoeBar)) << recipe.name << " pdl=" << pdl << " rel=" << cmp.rel;
        EXPECT_EQ(cuda::decode_split_finishes(), before) << recipe.name << ": the switch's 0 did not turn it off";
      }
      const ScopedEnv on("FINEGEMM_DECODE_SPLIT_FINISH", "1");
      for (int run = 0; run < 3; ++run) {
        const long long before = cuda::decode_split_finishes();
        const HostTensor got = run_on_gpu(data);
        EXPECT_EQ(cuda::decode_split_finishes(), before + 2)
            << recipe.name << " pdl=" << pdl << ": gate_up and down did not both finish their splits in the kernel";
        EXPECT_EQ(0, std::memcmp(got.bytes.data(), reduced.bytes.data(), got.bytes.size()))
            << recipe.name << " pdl=" << pdl << " run " << run;
      }
      int replay = 0;
      long long captured = 0;
      for (const HostTensor& got : captured_replays(data, 3, false, &captured))
        EXPECT_EQ(0, std::memcmp(got.bytes.data(), reduced.bytes.data(), got.bytes.size()))
            << recipe.name << " pdl=" << pdl << " graph replay " << replay++;
      EXPECT_EQ(captured, 2) << recipe.name << " pdl=" << pdl << ": the captured GEMMs did not finish their splits";
    }
  }
  EXPECT_GE(served, 4) << "the decode path served fewer recipes than expected";
  EXPECT_GE(ran[0], 1) << "no E4M3 recipe ran";
  EXPECT_GE(ran[1], 1) << "no FP4 recipe ran";
}

TEST_F(CudaMoe, DeterministicAndCapturableInOneGraph) {
  // The general grouped path and the decode path (512 rows over 16 experts: the decode path's default), each forced;
  // the decode path with its defaults (programmatic launches of the GEMMs and of the small kernels between them:
  // programmatic edges in the graph), with FINEGEMM_PDL=1 set, and with neither (FINEGEMM_PDL=0,
  // FINEGEMM_MOE_PDL_CHAIN=0: ordinary launches only).
  struct Case {
    const char* decode;
    const char* pdl;
    const char* chain;
  };
  for (const Case& c : {Case{"0", "", ""}, Case{"1", "", ""}, Case{"1", "1", ""}, Case{"1", "0", "0"}}) {
  SCOPED_TRACE(std::string("FINEGEMM_MOE_DECODE=") + c.decode + " FINEGEMM_PDL=" + c.pdl +
               " FINEGEMM_MOE_PDL_CHAIN=" + c.chain);
  const ScopedEnv decode("FINEGEMM_MOE_DECODE", c.decode);
  const ScopedEnv programmatic("FINEGEMM_PDL", c.pdl);
  const ScopedEnv chain("FINEGEMM_MOE_PDL_CHAIN", c.chain);
  MoeProblem problem;
  problem.tokens = 64;
  problem.hidden = 512;
  problem.inter = 256;
  problem.experts = 16;
  problem.top_k = 8;
  const auto masters = tools::make_moe_masters(rng(), problem);
  auto data = tools::make_moe(rng(), all_recipes()[0], problem, masters);
  HostTensor first;
  run_and_compare(data, &first);
  for (int run = 0; run < 10; ++run) {
    HostTensor again;
    run_and_compare(data, &again);
    ASSERT_EQ(0, std::memcmp(first.bytes.data(), again.bytes.data(), first.bytes.size())) << "run " << run;
  }
  // The whole layer in one graph, replayed: the same bits.
  for (const HostTensor& got : captured_replays(data, 1, true))
    EXPECT_EQ(0, std::memcmp(first.bytes.data(), got.bytes.data(), first.bytes.size()));
  }
}

}  // namespace
}  // namespace finegemm
