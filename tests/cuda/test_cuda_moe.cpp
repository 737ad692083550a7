// The MoE block on the GPU against the CPU reference (which applies the same intermediate quantization), for every
// recipe; random routing with -1 slots, empty experts, one expert that takes every token; bit-for-bit determinism;
// capture of the whole layer in one CUDA graph. Skips itself when no GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>

#include "cli_util.hpp"
#include "core/device_buffer.hpp"

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

std::mt19937_64& rng() {
  static std::mt19937_64 gen(std::random_device{}());
  return gen;
}

// Runs data on the GPU (poisoned output) and the reference; returns rel error and the GPU output.
tools::Comparison run_and_compare(const tools::MoeData& data, HostTensor* gpu_out = nullptr) {
  HostTensor ref(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  moe_experts(data.args(ref.view), {Backend::Reference});
  HostTensor out(data.problem.out_dtype, {data.problem.tokens, data.problem.hidden});
  tools::poison(out.view);
  DeviceRun gpu(Backend::Cuda);
  MoeArgs args = gpu.upload(data.args(out.view));
  moe_experts(args, {Backend::Cuda});
  gpu.download(args.out, out.view);
  if (gpu_out) *gpu_out = out;
  return tools::compare(out.view, ref.view);
}

struct Variant {
  MoeActivation act;
  float limit;
  bool interleaved;
  bool bias;
};

TEST_F(CudaMoe, EveryRecipeMatchesReference) {
  const Variant variants[] = {{MoeActivation::SwiGLU, 0.0f, false, false},
                              {MoeActivation::SwiGLU, 7.0f, false, true},
                              {MoeActivation::SwiGLUOai, 7.0f, true, true},
                              {MoeActivation::Silu, 0.0f, false, false}};
  const auto recipes = all_recipes();
  for (size_t r = 0; r < recipes.size(); ++r) {
    const auto& recipe = recipes[r];
    // Two activation variants per recipe, rotating, so every variant meets every kind of recipe across the list.
    for (int64_t tokens : {1, 77, 300}) {
      for (const auto& v : {variants[r % 4], variants[(r + 1 + tokens) % 4]}) {
        MoeProblem problem;
        problem.tokens = tokens;
        problem.hidden = 256;
        problem.inter = 256;
        problem.experts = 8;
        problem.top_k = 4;
        problem.activation = v.act;
        problem.swiglu_limit = v.limit;
        problem.interleaved = v.interleaved;
        problem.bias = v.bias;
        const auto masters = tools::make_moe_masters(rng(), problem);
        auto data = tools::make_moe(rng(), recipe, problem, masters);
        const auto cmp = run_and_compare(data);
        EXPECT_TRUE(cmp.ok(1e-2)) << recipe.name << " T=" << tokens << " " << problem.variant() << " rel=" << cmp.rel
                                  << " non-finite=" << cmp.non_finite;
      }
    }
  }
}

TEST_F(CudaMoe, SkewedRoutingEmptyExpertsAndOneExpertTakesAll) {
  for (const auto& recipe : {all_recipes()[0], all_recipes()[5], all_recipes()[1]}) {
    MoeProblem problem;
    problem.tokens = 200;
    problem.hidden = 384;
    problem.inter = 256;
    problem.experts = 16;
    problem.top_k = 6;
    const auto masters = tools::make_moe_masters(rng(), problem);
    auto data = tools::make_moe(rng(), recipe, problem, masters);
    // Expert 3 takes every token in slot 0; experts 8..15 get nothing; some slots are skipped.
    auto* idx = data.top_k_index.ptr<int32_t>();
    ASSERT_EQ(data.top_k_index.view.dtype, DType::I32);
    std::uniform_int_distribution<int> pick(0, 7);
    for (int64_t t = 0; t < problem.tokens; ++t)
      for (int64_t j = 0; j < problem.top_k; ++j) idx[t * problem.top_k + j] = j == 0 ? 3 : (t % 5 == j ? -1 : pick(rng()));
    tools::make_moe_inputs(rng(), data, true);
    for (int64_t t = 0; t < problem.tokens; ++t)
      for (int64_t j = 0; j < problem.top_k; ++j) idx[t * problem.top_k + j] = j == 0 ? 3 : (t % 5 == j ? -1 : pick(rng()));
    const auto cmp = run_and_compare(data);
    EXPECT_TRUE(cmp.ok(1e-2)) << recipe.name << " rel=" << cmp.rel;
  }
}

TEST_F(CudaMoe, DeterministicAndCapturableInOneGraph) {
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
  HostTensor out(problem.out_dtype, {problem.tokens, problem.hidden});
  tools::poison(out.view);
  DeviceRun gpu(Backend::Cuda);
  MoeArgs args = gpu.upload(data.args(out.view));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  moe_experts(args, {Backend::Cuda, stream});  // warm-up outside capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  moe_experts(args, {Backend::Cuda, stream});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(args.out.data, 0xFF, out.bytes.size() - 1, stream), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  gpu.download(args.out, out.view);
  EXPECT_EQ(0, std::memcmp(first.bytes.data(), out.bytes.data(), first.bytes.size()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace finegemm
