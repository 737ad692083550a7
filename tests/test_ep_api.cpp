// The expert-parallel API (finegemm/ep.hpp) where no GPU is needed: with EP built, the argument checks
// moe_experts_ep makes before it communicates (each names the argument); without EP, every entry point says so.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "testing.hpp"

namespace finegemm {
namespace {

using testing::Buffer;

void expect_error(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << message;
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    return;
  }
  ADD_FAILURE() << "expected finegemm::Error containing '" << (parts.empty() ? "" : parts[0]) << "', nothing was thrown";
}

constexpr int kWorld = 2;
constexpr int kExperts = 8;  // global; each rank holds 4

// One rank's valid arguments (host memory), for E = 8 global experts over 2 ranks.
struct EpProblem {
  int64_t tokens = 5, hidden = 256, inter = 128, top_k = 2, local = kExperts / kWorld;
  WeightRecipe wr;
  ActivationRecipe ar;
  Buffer hidden_states, index, weights, gate_up, gate_up_scale, down, down_scale, gate_up_act, down_act, out;
  MoeArgs args;

  explicit EpProblem(const WeightRecipe& w = WeightRecipe::block(), const ActivationRecipe& a = ActivationRecipe::per_token_group(128),
                     int64_t hidden_size = 256, int64_t local_experts = kExperts / kWorld)
      : hidden(hidden_size), local(local_experts), wr(w), ar(a) {
    hidden_states = testing::random_tensor(DType::BF16, {tokens, hidden});
    index = Buffer(DType::I32, {tokens, top_k});
    for (int64_t i = 0; i < tokens * top_k; ++i) index.ptr<int32_t>()[i] = static_cast<int32_t>(i % kExperts);
    weights = Buffer(DType::F32, {tokens, top_k});
    gate_up = Buffer(DType::F8_E4M3, {local, 2 * inter, hidden});
    down = Buffer(DType::F8_E4M3, {local, hidden, inter});
    auto scale_shape = [&](int64_t n, int64_t k) {
      std::vector<int64_t> s = weight_scale_shape(wr, n, k);
      s.insert(s.begin(), local);
      return s;
    };
    gate_up_scale = Buffer(DType::F32, scale_shape(2 * inter, hidden));
    down_scale = Buffer(DType::F32, scale_shape(hidden, inter));
    for (Buffer* b : {&gate_up_scale, &down_scale})
      for (int64_t i = 0; i < b->numel(); ++i) b->ptr<float>()[i] = 1.0f;
    out = Buffer(DType::BF16, {tokens, hidden});
    args.hidden = hidden_states;
    args.top_k_index = index;
    args.top_k_weights = weights;
    args.gate_up = gate_up;
    args.gate_up_scale = gate_up_scale;
    args.down = down;
    args.down_scale = down_scale;
    args.weight_recipe = wr;
    args.activation_recipe = ar;
    if (ar.is_static()) {
      gate_up_act = Buffer(DType::F32, {kExperts});
      down_act = Buffer(DType::F32, {local});
      for (Buffer* b : {&gate_up_act, &down_act})
        for (int64_t i = 0; i < b->numel(); ++i) b->ptr<float>()[i] = 0.01f;
      args.gate_up_act_scale = gate_up_act;
      args.down_act_scale = down_act;
    }
    args.out = out;
  }
  // The same views, marked as living on cuda:0 (validation reads no element, so host memory does for the checks).
  MoeArgs on_cuda() const {
    MoeArgs a = args;
    for (TensorView* t : {&a.hidden, &a.top_k_index, &a.top_k_weights, &a.gate_up, &a.gate_up_scale, &a.down,
                          &a.down_scale, &a.gate_up_act_scale, &a.down_act_scale, &a.out})
      if (t->defined()) t->device = Device{DeviceType::CUDA, 0};
    return a;
  }
};

#if FINEGEMM_WITH_EP

void validate(const MoeArgs& args, int experts = kExperts, int rank = 0, int world = kWorld,
              const EpMoeOptions& options = {}) {
  validate_moe_ep(args, experts, rank, world, 0, options);
}

TEST(EpApi, Available) { EXPECT_TRUE(ep_available()); }

TEST(EpApi, ValidArgumentsPassOnTheGroupsDevice) {
  EpProblem p;
  validate(p.on_cuda());
  EpProblem s(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  validate(s.on_cuda(), kExperts, 1);
  // down_act_scale may also be given for all experts (the rank's slice is used)
  Buffer down_all(DType::F32, {kExperts});
  MoeArgs a = s.on_cuda();
  a.down_act_scale = down_all;
  a.down_act_scale.device = Device{DeviceType::CUDA, 0};
  validate(a);
}

TEST(EpApi, GroupAndExpertCounts) {
  EpProblem p;
  expect_error([&] { validate(p.on_cuda(), 7); }, ErrorKind::Value,
               {"num_global_experts", "multiple of the world size W = 2", "got E = 7"});
  expect_error([&] { validate(p.on_cuda(), 0); }, ErrorKind::Value, {"num_global_experts", "got 0"});
  expect_error([&] { validate(p.on_cuda(), kExperts, 2); }, ErrorKind::Value, {"rank", "world = 2", "got 2"});
  expect_error([&] { validate(p.on_cuda(), kExperts, 0, 0); }, ErrorKind::Value, {"world", "got 0"});
  // gate_up holding all E experts instead of the rank's E/W
  EpProblem all(WeightRecipe::block(), ActivationRecipe::per_token_group(128), 256, kExperts);
  expect_error([&] { validate(all.on_cuda()); }, ErrorKind::Value,
               {"gate_up", "E/W = 4 local experts", "E = 8 global experts over W = 2 ranks", "got [8, 256, 256]"});
}

TEST(EpApi, StaticScalesArePerGlobalExpert) {
  EpProblem s(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  MoeArgs a = s.on_cuda();
  a.gate_up_act_scale.shape[0] = 4;  // the rank's experts only: the sender needs every expert's scale
  expect_error([&] { validate(a); }, ErrorKind::Value, {"gate_up_act_scale", "expected shape [8]", "GLOBAL", "got [4]"});
  a = s.on_cuda();
  a.down_act_scale.shape[0] = 3;
  expect_error([&] { validate(a); }, ErrorKind::Value, {"down_act_scale", "[4]", "[8]", "got [3]"});
}

TEST(EpApi, OptionsAndPlacement) {
  EpProblem p;
  EpMoeOptions options;
  options.wire_y = DType::F16;
  expect_error([&] { validate(p.on_cuda(), kExperts, 0, kWorld, options); }, ErrorKind::Type,
               {"wire_y", "float32 or bfloat16", "float16"});
  options = {};
  options.chunks = 0;
  expect_error([&] { validate(p.on_cuda(), kExperts, 0, kWorld, options); }, ErrorKind::Value, {"chunks", "got 0"});
  EpTimings timings;
  options.chunks = 2;
  options.timings = &timings;
  expect_error([&] { validate(p.on_cuda(), kExperts, 0, kWorld, options); }, ErrorKind::Value, {"timings", "chunks = 1"});
  // CPU tensors, or tensors on another device than the group's
  expect_error([&] { validate(p.args); }, ErrorKind::Value, {"hidden", "expected a tensor on cuda:0", "got cpu"});
  MoeArgs a = p.on_cuda();
  a.out.device = Device{DeviceType::CUDA, 1};
  expect_error([&] { validate(a); }, ErrorKind::Value, {"out", "expected a tensor on cuda:0", "got cuda:1"});
  // The layer's own checks still apply to the rank's arguments
  a = p.on_cuda();
  a.down.shape[1] = 128;
  expect_error([&] { validate(a); }, ErrorKind::Value, {"down"});
}

TEST(EpApi, WhatTheGpuKernelsDoNotServeIsRefusedByName) {
  // moe_experts would run these on the host; the EP layer refuses them, naming the argument
  EpProblem odd(WeightRecipe::block(32, 32), ActivationRecipe::per_token_group(32), 224);
  expect_error([&] { validate(odd.on_cuda()); }, ErrorKind::Value, {"hidden", "multiple of 128", "H=224", "moe_experts_ep"});
  EpProblem token(WeightRecipe::per_channel(), ActivationRecipe::per_token());
  expect_error([&] { validate(token.on_cuda()); }, ErrorKind::Value, {"activation_recipe", "per-token"});
}

#else

TEST(EpApi, BuiltWithoutExpertParallelism) {
  EXPECT_FALSE(ep_available());
  EpProblem p;
  expect_error([&] { validate_moe_ep(p.args, kExperts, 0, kWorld, 0); }, ErrorKind::Runtime,
               {"validate_moe_ep", "built without expert parallelism", "NCCL"});
  EpGroup group;
  expect_error([&] { moe_experts_ep(p.args, kExperts, group); }, ErrorKind::Runtime,
               {"moe_experts_ep", "built without expert parallelism"});
  expect_error([&] { ep_unique_id(); }, ErrorKind::Runtime, {"ep_unique_id"});
  expect_error([&] { EpGroup::init_all({0, 1}); }, ErrorKind::Runtime, {"init_all"});
}

#endif

}  // namespace
}  // namespace finegemm
