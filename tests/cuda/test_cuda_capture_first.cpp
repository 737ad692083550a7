// The first finegemm CUDA call of a process inside CUDA graph capture: the per-device scratch pool is created while
// the stream captures (its own program, so that no earlier test has created it). A linear call that quantizes its
// activations (stream-ordered scratch) is captured, replayed into a poisoned output and checked against the
// reference; a second replay gives the same bits. Then the same with programmatic dependent launch (FINEGEMM_PDL=1).
// A second test captures FP4 prefill through expanded weights.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "cli_util.hpp"
#include "finegemm/finegemm.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

// Captures linear(args) on a fresh stream, replays the graph into `out` and again into `again` (the output poisoned
// before each replay) and returns the captured graph's node count.
size_t capture_and_replay_twice(tools::DeviceRun& gpu, const LinearArgs& args, tools::HostTensor& out,
                                tools::HostTensor& again) {
  const size_t out_bytes = static_cast<size_t>(args.out.shape[0] * args.out.shape[1]) * dtype_size(args.out.dtype);
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  linear(args, {Backend::Cuda, stream});
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  size_t nodes = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (tools::HostTensor* dst : {&out, &again}) {
    EXPECT_EQ(cudaMemsetAsync(args.out.data, 0xFF, out_bytes, stream), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    gpu.download(args.out, dst->view);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return nodes;
}

TEST(CudaCaptureFirst, LinearCapturedBeforeAnyEagerCall) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(testing::test_seed());
  const NamedRecipe recipe{"block128x128 x group128", WeightRecipe::block(), ActivationRecipe::per_token_group(128)};
  // The second pass captures the decode kernel (M = 1) launched with programmatic dependent launch after the
  // activation quantization (FINEGEMM_PDL=1): a programmatic edge inside the graph.
  for (const char* pdl : {"0", "1"}) {
    setenv("FINEGEMM_PDL", pdl, 1);
    SCOPED_TRACE(std::string("FINEGEMM_PDL=") + pdl);
    for (int64_t m : {1, 300}) {
      const tools::LinearData data = tools::make_linear(rng, recipe, {m, 512, 1024, false, DType::BF16});
      const LinearArgs host_args = data.args(data.out.view);
      tools::HostTensor ref(DType::F32, {m, 512});
      LinearArgs ref_args = host_args;
      ref_args.out = ref.view;
      linear(ref_args, {Backend::Reference});

      tools::HostTensor out(DType::BF16, {m, 512}), again(DType::BF16, {m, 512});
      tools::poison(out.view);
      tools::poison(again.view);
      tools::DeviceRun gpu(Backend::Cuda);
      const LinearArgs args = gpu.upload(host_args);
      capture_and_replay_twice(gpu, args, out, again);
      if (::testing::Test::HasFailure()) return;
      const auto cmp = tools::compare(out.view, ref.view);
      EXPECT_EQ(cmp.non_finite, 0) << "M=" << m;
      EXPECT_LE(cmp.rel, 3e-3) << "M=" << m;
      EXPECT_EQ(0, std::memcmp(out.view.data, again.view.data, static_cast<size_t>(m) * 512 * 2)) << "M=" << m;
    }
  }
  unsetenv("FINEGEMM_PDL");
}

// FP4 prefill captured (after the test above, so not the first call): the weight expansion's scratch, the flag
// memset, the scan, the expansion and the three gated GEMM launches (fp4_expand.cu) as graph nodes; replayed twice
// into a poisoned output, checked against the reference, the same bits both times. Dense FP4 at M = 300 takes the
// expansion (FINEGEMM_FP4_EXPAND_M, default 256).
TEST(CudaCapture, Fp4PrefillExpansionInAGraph) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(testing::test_seed());
  const NamedRecipe recipe{"mxfp4/ue8m0 x group128-pow2", WeightRecipe::mxfp4(ScaleFormat::UE8M0),
                           ActivationRecipe::per_token_group(128, true)};
  const int64_t m = 300, n = 384, k = 1024;
  const tools::LinearData data = tools::make_linear(rng, recipe, {m, n, k, false, DType::BF16});
  const LinearArgs host_args = data.args(data.out.view);
  tools::HostTensor ref(DType::F32, {m, n});
  LinearArgs ref_args = host_args;
  ref_args.out = ref.view;
  linear(ref_args, {Backend::Reference});

  tools::HostTensor out(DType::BF16, {m, n}), again(DType::BF16, {m, n});
  tools::DeviceRun gpu(Backend::Cuda);
  const LinearArgs args = gpu.upload(host_args);
  const size_t nodes = capture_and_replay_twice(gpu, args, out, again);
  if (HasFailure()) return;
  // Activation quantization, memset, scan, expansion, three gated GEMMs, and the scratch's allocations and frees.
  EXPECT_GE(nodes, 10u) << "the expansion path was not captured (13 nodes with it, 6 without)";
  const auto cmp = tools::compare(out.view, ref.view);
  EXPECT_EQ(cmp.non_finite, 0);
  EXPECT_LE(cmp.rel, 3e-3);
  EXPECT_EQ(0, std::memcmp(out.view.data, again.view.data, static_cast<size_t>(m * n) * 2));
}

}  // namespace
}  // namespace finegemm
