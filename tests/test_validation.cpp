// Every bad argument gives a finegemm::Error of the right kind whose message names the argument, what was
// expected and what was given; every good one passes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "testing.hpp"

namespace finegemm {
namespace {

using testing::Buffer;

// Runs f, expects a finegemm::Error of `kind` whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    if (std::getenv("FINEGEMM_PRINT_ERRORS")) std::printf("  %s\n", message.c_str());  // to read the messages
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << message;
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected finegemm::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected finegemm::Error containing '" << (parts.empty() ? "" : parts[0]) << "', nothing was thrown";
}

constexpr Device kCuda{DeviceType::CUDA, 0};

// ---- A valid linear problem for a recipe; each test breaks one thing.
struct LinearProblem {
  int64_t m, n, k;
  WeightRecipe wr;
  ActivationRecipe ar;
  Buffer x, x_scale, weight, weight_scale, bias, out;
  LinearArgs args;

  LinearProblem(const WeightRecipe& w, const ActivationRecipe& a, int64_t m_ = 4, int64_t n_ = 192, int64_t k_ = 256)
      : m(m_), n(n_), k(k_), wr(w), ar(a) {
    x = Buffer(DType::BF16, {m, k});
    weight = Buffer(wr.element == ElementType::FP4_E2M1 ? DType::U8 : DType::F8_E4M3, {n, weight_storage_cols(wr, k)});
    weight_scale = Buffer(weight_scale_dtype(wr), weight_scale_shape(wr, n, k));
    fill_scales(weight_scale);
    bias = Buffer(DType::F32, {n});
    out = Buffer(DType::BF16, {m, n});
    args.x = x;
    args.activation = ar;
    args.weight = weight;
    args.weight_scale = weight_scale;
    args.weight_recipe = wr;
    args.bias = bias;
    args.out = out;
    if (ar.is_static()) {
      x_scale = Buffer(DType::F32, {});
      x_scale.ptr<float>()[0] = 0.01f;
      args.x_scale = x_scale;
    }
  }

  static void fill_scales(Buffer& s) {
    for (int64_t i = 0; i < s.numel(); ++i) {
      switch (s.view.dtype) {
        case DType::F32: s.ptr<float>()[i] = 0.5f; break;
        case DType::I32: s.ptr<int32_t>()[i] = 0x7F7F7F7F; break;
        default: s.ptr<uint8_t>()[i] = 120;
      }
    }
  }
  void validate() const { validate_linear(args); }
};

LinearProblem block128() { return {WeightRecipe::block(), ActivationRecipe::per_token_group(128)}; }

// ---- A valid MoE problem.
struct MoeProblem {
  int64_t t = 5, h = 256, i = 128, e = 4, top_k = 2;
  Buffer hidden, index, weights, gate_up, gate_up_scale, down, down_scale, gate_up_act_scale, down_act_scale, out;
  MoeArgs args;

  explicit MoeProblem(const WeightRecipe& wr = WeightRecipe::block(), const ActivationRecipe& ar = ActivationRecipe::per_token_group(128),
                      MoeActivation act = MoeActivation::SwiGLU) {
    const int64_t rows = moe_activation_has_gate(act) ? 2 * i : i;
    const DType wdtype = wr.element == ElementType::FP4_E2M1 ? DType::I8 : DType::F8_E4M3;
    hidden = Buffer(DType::BF16, {t, h});
    index = Buffer(DType::I32, {t, top_k});
    for (int64_t j = 0; j < t * top_k; ++j) index.ptr<int32_t>()[j] = j % 3 == 2 ? -1 : static_cast<int32_t>(j % e);
    weights = Buffer(DType::F32, {t, top_k});
    gate_up = Buffer(wdtype, {e, rows, weight_storage_cols(wr, h)});
    down = Buffer(wdtype, {e, h, weight_storage_cols(wr, i)});
    auto with_e = [&](std::vector<int64_t> s) {
      s.insert(s.begin(), e);
      return s;
    };
    gate_up_scale = Buffer(weight_scale_dtype(wr), with_e(weight_scale_shape(wr, rows, h)));
    down_scale = Buffer(weight_scale_dtype(wr), with_e(weight_scale_shape(wr, h, i)));
    LinearProblem::fill_scales(gate_up_scale);
    LinearProblem::fill_scales(down_scale);
    out = Buffer(DType::F32, {t, h});
    args.hidden = hidden;
    args.top_k_index = index;
    args.top_k_weights = weights;
    args.gate_up = gate_up;
    args.gate_up_scale = gate_up_scale;
    args.down = down;
    args.down_scale = down_scale;
    args.weight_recipe = wr;
    args.activation_recipe = ar;
    args.activation = act;
    args.out = out;
    if (ar.is_static()) {
      gate_up_act_scale = Buffer(DType::F32, {e});
      down_act_scale = Buffer(DType::F32, {e});
      LinearProblem::fill_scales(gate_up_act_scale);
      LinearProblem::fill_scales(down_act_scale);
      args.gate_up_act_scale = gate_up_act_scale;
      args.down_act_scale = down_act_scale;
    }
  }
  void validate() const { validate_moe(args); }
};

// ===== Happy paths ==============================================================================================

TEST(Validation, EveryRecipeValidatesLinearAndMoe) {
  for (const NamedRecipe& r : all_recipes()) {
    SCOPED_TRACE(r.name);
    LinearProblem p(r.weight, r.activation);
    EXPECT_NO_THROW(p.validate());
    p.args.bias = {};
    EXPECT_NO_THROW(p.validate());
    // Pre-quantized activations with their scales.
    Buffer xq(DType::F8_E4M3, {p.m, p.k}), xs(DType::F32, activation_scale_shape(r.activation, p.m, p.k));
    LinearProblem::fill_scales(xs);
    p.args.x = xq;
    p.args.x_scale = xs;
    EXPECT_NO_THROW(p.validate());

    for (MoeActivation act : {MoeActivation::SwiGLU, MoeActivation::Relu2}) {
      MoeProblem moe(r.weight, r.activation, act);
      EXPECT_NO_THROW(moe.validate());
    }
  }
}

TEST(Validation, AcceptedScaleShapeVariants) {
  LinearProblem channel(WeightRecipe::per_channel(), ActivationRecipe::per_token());
  Buffer s(DType::F32, {channel.n, 1});
  LinearProblem::fill_scales(s);
  channel.args.weight_scale = s;
  EXPECT_NO_THROW(channel.validate());  // [N, 1]

  LinearProblem tensor(WeightRecipe::per_tensor(), ActivationRecipe::static_per_tensor());
  Buffer one(DType::F32, {1});
  LinearProblem::fill_scales(one);
  tensor.args.weight_scale = one;
  tensor.args.x_scale = one;
  EXPECT_NO_THROW(tensor.validate());  // [1] for both scalars

  LinearProblem ue8m0(WeightRecipe::block(128, 128, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128, true));
  Buffer u8(DType::U8, ue8m0.weight_scale.view.sizes());
  LinearProblem::fill_scales(u8);
  ue8m0.args.weight_scale = u8;
  EXPECT_NO_THROW(ue8m0.validate());  // UE8M0 scales as plain uint8

  LinearProblem fp4(WeightRecipe::mxfp4(), ActivationRecipe::per_token_group(32));
  Buffer i8(DType::I8, fp4.weight.view.sizes());
  fp4.args.weight = i8;
  EXPECT_NO_THROW(fp4.validate());  // DeepSeek-V4 stores packed FP4 as int8
}

// ===== Linear ===================================================================================================

TEST(Validation, WrongScaleShape) {
  LinearProblem p = block128();
  Buffer s(DType::F32, {2, 3});
  p.args.weight_scale = s;
  expect_error([&] { p.validate(); }, ErrorKind::Value,
               {"weight_scale", "expected shape [2, 2]", "N=192, K=256", "128x128 blocks", "got [2, 3]"});

  LinearProblem channel(WeightRecipe::per_channel(), ActivationRecipe::per_token());
  Buffer c(DType::F32, {channel.n, 2});
  channel.args.weight_scale = c;
  expect_error([&] { channel.validate(); }, ErrorKind::Value, {"weight_scale", "[192] or [192, 1]", "got [192, 2]"});

  LinearProblem group = block128();
  Buffer xq(DType::F8_E4M3, {group.m, group.k}), xs(DType::F32, {group.m, 3});
  group.args.x = xq;
  group.args.x_scale = xs;
  expect_error([&] { group.validate(); }, ErrorKind::Value, {"x_scale", "[4, 2]", "got [4, 3]"});
}

TEST(Validation, WrongDtype) {
  LinearProblem p = block128();
  Buffer w(DType::BF16, {p.n, p.k});
  p.args.weight = w;
  expect_error([&] { p.validate(); }, ErrorKind::Type, {"weight", "float8_e4m3fn", "got bfloat16"});

  LinearProblem ue8m0(WeightRecipe::block(128, 128, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128));
  Buffer f32(DType::F32, ue8m0.weight_scale.view.sizes());
  ue8m0.args.weight_scale = f32;
  expect_error([&] { ue8m0.validate(); }, ErrorKind::Type, {"weight_scale", "float8_e8m0fnu or uint8", "got float32"});

  LinearProblem fp4(WeightRecipe::mxfp4(), ActivationRecipe::per_token_group(32));
  Buffer f8(DType::F8_E4M3, fp4.weight.view.sizes());
  fp4.args.weight = f8;
  expect_error([&] { fp4.validate(); }, ErrorKind::Type, {"weight", "uint8 or int8", "packed FP4", "got float8_e4m3fn"});

  LinearProblem x = block128();
  Buffer xi(DType::I32, {x.m, x.k});
  x.args.x = xi;
  expect_error([&] { x.validate(); }, ErrorKind::Type, {"x", "float32, bfloat16, float16 or float8_e4m3fn", "got int32"});

  LinearProblem out = block128();
  Buffer o(DType::F8_E4M3, {out.m, out.n});
  out.args.out = o;
  expect_error([&] { out.validate(); }, ErrorKind::Type, {"out", "bfloat16, float16 or float32", "got float8_e4m3fn"});

  LinearProblem packed(WeightRecipe::block(128, 128, ScaleFormat::UE8M0_PACKED), ActivationRecipe::per_token_group(128, true));
  Buffer bytes(DType::U8, {2, 2});
  packed.args.weight_scale = bytes;
  expect_error([&] { packed.validate(); }, ErrorKind::Type, {"weight_scale", "int32", "got uint8"});
}

TEST(Validation, KNotDivisibleByTheBlock) {
  LinearProblem p(WeightRecipe::block(), ActivationRecipe::per_token(), 4, 192, 200);
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"x", "K=200", "multiple of 128", "block_k=128"});

  LinearProblem mx(WeightRecipe::mxfp4(), ActivationRecipe::per_token(), 4, 64, 48);
  expect_error([&] { mx.validate(); }, ErrorKind::Value, {"K=48", "multiple of 32", "MX"});

  LinearProblem group(WeightRecipe::block(32, 32), ActivationRecipe::per_token_group(128), 4, 64, 96);
  expect_error([&] { group.validate(); }, ErrorKind::Value, {"x", "K=96", "activation group size 128"});
}

TEST(Validation, NaNAndNonPositiveScales) {
  LinearProblem p = block128();
  p.weight_scale.ptr<float>()[1] = NAN;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"weight_scale", "finite scales > 0", "nan", "index [0, 1]"});
  p.weight_scale.ptr<float>()[1] = -1.0f;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"weight_scale", "got -1", "index [0, 1]"});

  LinearProblem ue8m0(WeightRecipe::block(128, 128, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(128));
  ue8m0.weight_scale.ptr<uint8_t>()[3] = 255;
  expect_error([&] { ue8m0.validate(); }, ErrorKind::Value, {"weight_scale", "NaN (byte 255)", "index [1, 1]"});

  // Packed: byte 255 in a used slot is an error; in the padding it is not looked at.
  LinearProblem packed(WeightRecipe::block(128, 128, ScaleFormat::UE8M0_PACKED), ActivationRecipe::per_token_group(128, true));
  packed.weight_scale.ptr<int32_t>()[0] = fmt::ue8m0_pack(127, 127, 255, 255);  // K=256: 2 scales, bytes 2-3 padding
  EXPECT_NO_THROW(packed.validate());
  packed.weight_scale.ptr<int32_t>()[1] = fmt::ue8m0_pack(127, 255, 127, 127);
  expect_error([&] { packed.validate(); }, ErrorKind::Value, {"weight_scale", "byte 1", "index [1, 0]"});

  LinearProblem stat(WeightRecipe::per_tensor(), ActivationRecipe::static_per_tensor());
  stat.x_scale.ptr<float>()[0] = 0.0f;
  expect_error([&] { stat.validate(); }, ErrorKind::Value, {"x_scale", "finite scales > 0", "got 0"});
  stat.x_scale.ptr<float>()[0] = INFINITY;
  expect_error([&] { stat.validate(); }, ErrorKind::Value, {"x_scale", "got inf"});
}

TEST(Validation, WrongOutAndBiasShape) {
  LinearProblem p = block128();
  Buffer o(DType::BF16, {p.m, p.n + 1});
  p.args.out = o;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"out", "expected shape [4, 192]", "got [4, 193]"});

  LinearProblem b = block128();
  Buffer bias(DType::F32, {b.n, 1});
  b.args.bias = bias;
  expect_error([&] { b.validate(); }, ErrorKind::Value, {"bias", "[192]", "got [192, 1]"});

  LinearProblem w = block128();
  Buffer weight(DType::F8_E4M3, {w.n, w.k + 128});
  w.args.weight = weight;
  expect_error([&] { w.validate(); }, ErrorKind::Value, {"weight", "[192, 256]", "got [192, 384]"});

  LinearProblem fp4(WeightRecipe::mxfp4(), ActivationRecipe::per_token_group(32));
  Buffer unpacked(DType::U8, {fp4.n, fp4.k});
  fp4.args.weight = unpacked;
  expect_error([&] { fp4.validate(); }, ErrorKind::Value, {"weight", "K/2", "[192, 128]", "got [192, 256]"});
}

TEST(Validation, MixedDevices) {
  LinearProblem p = block128();
  p.args.weight.device = kCuda;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"weight", "one device", "x is on cpu", "got cuda:0"});

  LinearProblem q = block128();
  q.args.out.device = Device{DeviceType::CUDA, 1};
  q.args.x.device = q.args.weight.device = q.args.weight_scale.device = q.args.bias.device = kCuda;
  expect_error([&] { q.validate(); }, ErrorKind::Value, {"out", "cuda:0", "got cuda:1"});
}

TEST(Validation, CudaTensorsSkipValueChecks) {
  LinearProblem p = block128();
  p.weight_scale.ptr<float>()[0] = NAN;
  for (TensorView* t : {&p.args.x, &p.args.weight, &p.args.weight_scale, &p.args.bias, &p.args.out}) t->device = kCuda;
  EXPECT_NO_THROW(p.validate());

  MoeProblem moe;
  moe.index.ptr<int32_t>()[0] = 99;
  for (TensorView* t : {&moe.args.hidden, &moe.args.top_k_index, &moe.args.top_k_weights, &moe.args.gate_up,
                        &moe.args.gate_up_scale, &moe.args.down, &moe.args.down_scale, &moe.args.out})
    t->device = kCuda;
  EXPECT_NO_THROW(moe.validate());
}

// The scales of a pre-quantized x with token groups: row-major, or M-major ([M, G] with strides [1, ld], ld >= M).
TEST(Validation, MMajorActivationScales) {
  LinearProblem p = block128();  // M = 4, K = 256: two groups
  Buffer xq(DType::F8_E4M3, {p.m, p.k}), mem(DType::F32, {2, 8});
  for (int64_t i = 0; i < 16; ++i) mem.ptr<float>()[i] = 0.5f;
  TensorView xs = mem.view;
  xs.shape[0] = p.m;
  xs.shape[1] = 2;
  xs.strides[0] = 1;
  xs.strides[1] = 8;
  p.args.x = xq;
  p.args.x_scale = xs;
  EXPECT_NO_THROW(p.validate());
  // Values are checked through the strides: element (1, 1) lives at 8 + 1.
  mem.ptr<float>()[9] = 0.0f;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"x_scale", "finite scales > 0", "got 0"});
  mem.ptr<float>()[9] = 0.5f;
  // Rows overlapping (ld < M) or any other strides: a clear error.
  p.args.x_scale.strides[1] = 3;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"x_scale", "M-major", "ld >= 4", "strides [1, 3]"});
  p.args.x_scale.strides[0] = 2;
  p.args.x_scale.strides[1] = 8;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"x_scale", "contiguous", "strides [2, 8]"});
  // Per-token scales and the scales a quantizer writes stay row-major.
  LinearProblem token(WeightRecipe::block(), ActivationRecipe::per_token());
  Buffer tq(DType::F8_E4M3, {token.m, token.k}), ts(DType::F32, {token.m, 1});
  LinearProblem::fill_scales(ts);
  token.args.x = tq;
  token.args.x_scale = ts;
  EXPECT_NO_THROW(token.validate());
}

TEST(Validation, PresenceAbsenceAndLayout) {
  LinearProblem missing = block128();
  missing.args.weight_scale = {};
  expect_error([&] { missing.validate(); }, ErrorKind::Value, {"weight_scale", "required", "left out"});

  LinearProblem extra = block128();
  Buffer s(DType::F32, {});
  extra.args.x_scale = s;
  expect_error([&] { extra.validate(); }, ErrorKind::Value, {"x_scale", "expected no tensor", "dynamic recipe group128"});

  LinearProblem pre = block128();
  Buffer xq(DType::F8_E4M3, {pre.m, pre.k});
  pre.args.x = xq;
  expect_error([&] { pre.validate(); }, ErrorKind::Value, {"x_scale", "required", "float8_e4m3fn"});

  LinearProblem stat(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  stat.args.x_scale = {};
  expect_error([&] { stat.validate(); }, ErrorKind::Value, {"x_scale", "required", "static"});

  LinearProblem strided = block128();
  std::swap(strided.args.weight.strides[0], strided.args.weight.strides[1]);
  expect_error([&] { strided.validate(); }, ErrorKind::Value, {"weight", "contiguous", "strides [1, 256]"});

  LinearProblem null = block128();
  null.args.out.data = nullptr;
  expect_error([&] { null.validate(); }, ErrorKind::Value, {"out", "null pointer"});

  LinearProblem rank = block128();
  Buffer x3(DType::BF16, {1, rank.m, rank.k});
  rank.args.x = x3;
  expect_error([&] { rank.validate(); }, ErrorKind::Value, {"x", "2 dimensions [M, K]", "got shape [1, 4, 256]"});
}

TEST(Validation, RecipeSanity) {
  LinearProblem group = block128();
  group.args.activation.group_size = 64;
  expect_error([&] { group.validate(); }, ErrorKind::Value, {"activation", "group_size 32 or 128", "got 64"});

  LinearProblem block = block128();
  block.args.weight_recipe.block_k = 0;
  expect_error([&] { block.validate(); }, ErrorKind::Value, {"weight_recipe", "positive block sizes", "128x0"});

  LinearProblem fp4 = block128();
  fp4.args.weight_recipe.element = ElementType::FP4_E2M1;
  expect_error([&] { fp4.validate(); }, ErrorKind::Value, {"weight_recipe", "FP4 E2M1", "MX", "got block"});

  LinearProblem channel(WeightRecipe::per_channel(), ActivationRecipe::per_token());
  channel.args.weight_recipe.scale_format = ScaleFormat::UE8M0;
  expect_error([&] { channel.validate(); }, ErrorKind::Value, {"weight_recipe", "UE8M0", "per-channel"});

  LinearProblem mx(WeightRecipe::mxfp4(), ActivationRecipe::per_token_group(32));
  mx.args.weight_recipe.block_k = 16;
  expect_error([&] { mx.validate(); }, ErrorKind::Value, {"weight_recipe", "1x32", "got 1x16"});
}

// ===== MoE ======================================================================================================

TEST(Validation, MoeIndexOutOfRange) {
  MoeProblem p;
  p.index.ptr<int32_t>()[2 * p.top_k + 1] = 4;  // E = 4
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"top_k_index", "[0, 4)", "got 4", "token 2, slot 1"});
  p.index.ptr<int32_t>()[2 * p.top_k + 1] = -2;
  expect_error([&] { p.validate(); }, ErrorKind::Value, {"top_k_index", "got -2", "token 2, slot 1"});

  MoeProblem wide;
  Buffer idx(DType::I64, {wide.t, wide.top_k});
  for (int64_t j = 0; j < idx.numel(); ++j) idx.ptr<int64_t>()[j] = -1;
  idx.ptr<int64_t>()[0] = int64_t(1) << 40;
  wide.args.top_k_index = idx;
  expect_error([&] { wide.validate(); }, ErrorKind::Value, {"top_k_index", "token 0, slot 0"});

  MoeProblem dtype;
  Buffer f(DType::F32, {dtype.t, dtype.top_k});
  dtype.args.top_k_index = f;
  expect_error([&] { dtype.validate(); }, ErrorKind::Type, {"top_k_index", "int32 or int64", "got float32"});
}

TEST(Validation, MoeShapes) {
  MoeProblem scale;
  Buffer s(DType::F32, {scale.e, 2, 3});
  scale.args.gate_up_scale = s;
  expect_error([&] { scale.validate(); }, ErrorKind::Value, {"gate_up_scale", "[4, 2, 2]", "2I=256, H=256", "E=4", "got [4, 2, 3]"});

  MoeProblem rows;
  Buffer gu(DType::F8_E4M3, {rows.e, rows.i, rows.h});  // I rows for a gated activation
  rows.args.gate_up = gu;
  expect_error([&] { rows.validate(); }, ErrorKind::Value, {"gate_up", "[4, 256, 256]", "2I", "got [4, 128, 256]"});

  MoeProblem down;
  Buffer d(DType::F8_E4M3, {down.e + 1, down.h, down.i});
  down.args.down = d;
  expect_error([&] { down.validate(); }, ErrorKind::Value, {"down", "E=4 from gate_up", "got [5, 256, 128]"});

  MoeProblem ragged(WeightRecipe::block(), ActivationRecipe::per_token());
  Buffer d2(DType::F8_E4M3, {ragged.e, ragged.h, 96});
  ragged.args.down = d2;
  expect_error([&] { ragged.validate(); }, ErrorKind::Value, {"down", "I=96", "multiple of 128"});

  MoeProblem out;
  Buffer o(DType::F32, {out.t, out.h + 1});
  out.args.out = o;
  expect_error([&] { out.validate(); }, ErrorKind::Value, {"out", "[5, 256]", "got [5, 257]"});

  MoeProblem weights;
  Buffer w(DType::F32, {weights.t, weights.top_k + 1});
  weights.args.top_k_weights = w;
  expect_error([&] { weights.validate(); }, ErrorKind::Value, {"top_k_weights", "[5, 2]", "got [5, 3]"});

  MoeProblem bias;
  Buffer b(DType::F32, {bias.e, bias.i});
  bias.args.gate_up_bias = b;
  expect_error([&] { bias.validate(); }, ErrorKind::Value, {"gate_up_bias", "[4, 256]", "got [4, 128]"});
}

TEST(Validation, MoeScalesAndOptions) {
  MoeProblem nan;
  nan.down_scale.ptr<float>()[5] = NAN;
  expect_error([&] { nan.validate(); }, ErrorKind::Value, {"down_scale", "nan", "index [2, 1, 0]"});

  MoeProblem stat(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  EXPECT_NO_THROW(stat.validate());
  stat.args.down_act_scale = {};
  expect_error([&] { stat.validate(); }, ErrorKind::Value, {"down_act_scale", "required", "one input scale per expert"});
  MoeProblem stat_shape(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  Buffer one(DType::F32, {1});
  stat_shape.args.gate_up_act_scale = one;
  expect_error([&] { stat_shape.validate(); }, ErrorKind::Value, {"gate_up_act_scale", "[4]", "got [1]"});
  MoeProblem stat_nan(WeightRecipe::block(), ActivationRecipe::static_per_tensor());
  stat_nan.gate_up_act_scale.ptr<float>()[3] = NAN;
  expect_error([&] { stat_nan.validate(); }, ErrorKind::Value, {"gate_up_act_scale", "index [3]"});

  MoeProblem dynamic;
  Buffer e(DType::F32, {dynamic.e});
  dynamic.args.gate_up_act_scale = e;
  expect_error([&] { dynamic.validate(); }, ErrorKind::Value, {"gate_up_act_scale", "expected no tensor", "dynamic"});

  MoeProblem limit;
  limit.args.swiglu_limit = -1.0f;
  expect_error([&] { limit.validate(); }, ErrorKind::Value, {"swiglu_limit", ">= 0", "got -1"});

  MoeProblem interleaved(WeightRecipe::block(), ActivationRecipe::per_token_group(128), MoeActivation::Gelu);
  interleaved.args.interleaved_gate_up = true;
  expect_error([&] { interleaved.validate(); }, ErrorKind::Value, {"interleaved_gate_up", "gelu", "no gate"});

  MoeProblem devices;
  devices.args.down_scale.device = kCuda;
  expect_error([&] { devices.validate(); }, ErrorKind::Value, {"down_scale", "one device", "hidden is on cpu", "got cuda:0"});

  MoeProblem fp4(WeightRecipe::mxfp4(), ActivationRecipe::per_token_group(32));
  EXPECT_NO_THROW(fp4.validate());
  Buffer f8(DType::F8_E4M3, fp4.down.view.sizes());
  fp4.args.down = f8;
  expect_error([&] { fp4.validate(); }, ErrorKind::Type, {"down", "uint8 or int8", "got float8_e4m3fn"});
}

// ===== Quantize ops =============================================================================================

TEST(Validation, QuantizeActivationsAndWeights) {
  const ActivationRecipe group = ActivationRecipe::per_token_group(128);
  Buffer x(DType::F32, {3, 256}), q(DType::F8_E4M3, {3, 256}), s(DType::F32, {3, 2});
  EXPECT_NO_THROW(validate_quantize_activations(x, group, q, s));
  Buffer s_bad(DType::F32, {3, 3});
  expect_error([&] { validate_quantize_activations(x, group, q, s_bad); }, ErrorKind::Value, {"x_scale", "[3, 2]", "got [3, 3]"});
  Buffer q_bad(DType::BF16, {3, 256});
  expect_error([&] { validate_quantize_activations(x, group, q_bad, s); }, ErrorKind::Type, {"x_q", "float8_e4m3fn", "got bfloat16"});
  Buffer token_scale(DType::F32, {3});
  EXPECT_NO_THROW(validate_quantize_activations(x, ActivationRecipe::per_token(), q, token_scale));
  Buffer stat(DType::F32, {});
  stat.ptr<float>()[0] = NAN;
  expect_error([&] { validate_quantize_activations(x, ActivationRecipe::static_per_tensor(), q, stat); }, ErrorKind::Value,
               {"x_scale", "nan"});

  for (const NamedRecipe& r : all_recipes()) {
    SCOPED_TRACE(r.name);
    const int64_t n = 100, k = 256;
    Buffer w(DType::BF16, {n, k});
    Buffer wq(r.weight.element == ElementType::FP4_E2M1 ? DType::U8 : DType::F8_E4M3, {n, weight_storage_cols(r.weight, k)});
    Buffer ws(weight_scale_dtype(r.weight), weight_scale_shape(r.weight, n, k));
    ws.bytes.assign(ws.bytes.size(), 0xFF);  // an output: its (NaN) contents are not checked
    EXPECT_NO_THROW(validate_quantize_weights(w, r.weight, wq, ws));
  }
  const WeightRecipe mx = WeightRecipe::mxfp4();
  Buffer w(DType::F32, {8, 64}), wq(DType::U8, {8, 64}), ws(DType::F8_E8M0, {8, 2});
  expect_error([&] { validate_quantize_weights(w, mx, wq, ws); }, ErrorKind::Value, {"w_q", "[N, K/2]", "[8, 32]", "got [8, 64]"});
  Buffer wi(DType::I32, {8, 64});
  expect_error([&] { validate_quantize_weights(wi, mx, wq, ws); }, ErrorKind::Type, {"w", "got int32"});
}

}  // namespace
}  // namespace finegemm
