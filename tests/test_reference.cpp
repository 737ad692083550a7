// The CPU reference against definitions written out again here, independently:
//  - quantize/dequantize properties for every recipe of all_recipes() (scale shapes, error bounds, round trips);
//  - linear on exactly representable data equals the exact product;
//  - MoE on tiny hand-checked cases and, for every recipe and activation kind, against a token-major evaluation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "cpu/cpu_backend.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

using testing::Buffer;
using testing::get;
using testing::poison;
using testing::rng;

int rand_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng()); }

// ---- A quantized weight built code by code, with its exact dequantized value.
// Codes are E4M3 values of magnitude ≥ 2^-2 (or 0), or any E2M1 nibble; scales have at most 3 significant
// bits. Every product code·scale is then exact in float (and bf16), and sums of products are exact in double.
struct Weight {
  Buffer codes, scales;
  std::vector<double> dense;  // [E?, n, k]
};

uint8_t random_e4m3_code() {
  if (rand_int(0, 9) == 0) return 0;
  for (;;) {
    const uint8_t code = static_cast<uint8_t>((rand_int(5, 15) << 3) | rand_int(0, 7));
    if (code != 0x7F) return static_cast<uint8_t>(code | (rand_int(0, 1) << 7));
  }
}

// experts < 0: a plain [n, k] weight. force_max: every scale block holds one element of the largest code
// (±448 or ±6), so quantize(dequantize(w)) reproduces the codes and scales exactly.
Weight make_weight(const WeightRecipe& r, int64_t experts, int64_t n, int64_t k, int scale_exp, bool force_max) {
  const bool fp4 = r.element == ElementType::FP4_E2M1;
  const int64_t lead = std::max<int64_t>(experts, 1);
  std::vector<int64_t> code_shape{n, weight_storage_cols(r, k)}, scale_shape = weight_scale_shape(r, n, k);
  if (experts >= 0) {
    code_shape.insert(code_shape.begin(), experts);
    scale_shape.insert(scale_shape.begin(), experts);
  }
  Weight w{Buffer(fp4 ? DType::U8 : DType::F8_E4M3, code_shape), Buffer(weight_scale_dtype(r), scale_shape), {}};
  w.dense.assign(static_cast<size_t>(lead * n * k), 0.0);

  // Which scale covers (row, col), in the unpacked [scale_rows, scale_cols] grid.
  const int64_t bn = r.granularity == WeightGranularity::Block ? r.block_n : 1;
  const int64_t bk = r.granularity == WeightGranularity::Block ? r.block_k : 32;
  auto scale_index = [&](int64_t row, int64_t col) -> std::pair<int64_t, int64_t> {
    switch (r.granularity) {
      case WeightGranularity::PerTensor: return {0, 0};
      case WeightGranularity::PerChannel: return {row, 0};
      default: return {row / bn, col / bk};
    }
  };
  const int64_t srows = r.scale_rows(n), scols = r.scale_cols(k);
  const int64_t per_expert = r.scale_format == ScaleFormat::UE8M0_PACKED ? srows * ((scols + 3) / 4) : srows * scols;
  if (r.scale_format == ScaleFormat::UE8M0_PACKED)
    for (int64_t i = 0; i < w.scales.numel(); ++i) w.scales.ptr<int32_t>()[i] = 0x7F7F7F7F;

  for (int64_t e = 0; e < lead; ++e) {
    std::vector<double> scale(static_cast<size_t>(srows * scols));
    for (int64_t i = 0; i < srows * scols; ++i) {
      const int exp = scale_exp + rand_int(-1, 1);
      const int64_t sr = i / scols, sc = i % scols;
      if (r.scale_format == ScaleFormat::FP32) {
        const float mant[4] = {1.0f, 1.25f, 1.5f, 1.75f};
        const float s = std::ldexp(mant[rand_int(0, 3)], exp);
        w.scales.ptr<float>()[e * per_expert + i] = s;
        scale[i] = s;
      } else {
        const uint8_t byte = static_cast<uint8_t>(127 + exp);
        if (r.scale_format == ScaleFormat::UE8M0) {
          w.scales.ptr<uint8_t>()[e * per_expert + i] = byte;
        } else {
          uint8_t* word = reinterpret_cast<uint8_t*>(w.scales.ptr<int32_t>() + e * per_expert + sr * ((scols + 3) / 4) + sc / 4);
          word[sc % 4] = byte;  // little-endian: byte j of the int32 is group 4i + j
        }
        scale[i] = std::ldexp(1.0, exp);
      }
    }
    std::set<std::pair<int64_t, int64_t>> has_max;
    for (int64_t row = 0; row < n; ++row) {
      for (int64_t col = 0; col < k; ++col) {
        const auto [sr, sc] = scale_index(row, col);
        const bool put_max = force_max && has_max.insert({sr, sc}).second;
        double value;
        if (fp4) {
          const uint8_t nibble = put_max ? static_cast<uint8_t>(rand_int(0, 1) ? 0x7 : 0xF) : static_cast<uint8_t>(rand_int(0, 15));
          uint8_t& byte = w.codes.ptr<uint8_t>()[e * n * (k / 2) + row * (k / 2) + col / 2];
          byte = (col & 1) ? static_cast<uint8_t>((byte & 0x0F) | (nibble << 4)) : static_cast<uint8_t>((byte & 0xF0) | nibble);
          value = fmt::e2m1_to_float(nibble);
        } else {
          const uint8_t code = put_max ? static_cast<uint8_t>(rand_int(0, 1) ? 0x7E : 0xFE) : random_e4m3_code();
          w.codes.ptr<uint8_t>()[e * n * k + row * k + col] = code;
          value = fmt::e4m3_to_float(code);
        }
        w.dense[e * n * k + row * k + col] = value * scale[sr * scols + sc];
      }
    }
  }
  return w;
}

// Half the distance between neighbours of the format around |v| (v in units of the scale).
double half_ulp(ElementType element, double v) {
  const double a = std::fabs(v);
  if (element == ElementType::FP4_E2M1) return a < 2.0 ? 0.25 : (a < 4.0 ? 0.5 : 1.0);
  if (a < 0.015625) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(a))) - 4);
}

// Distinct weight and activation recipes of all_recipes().
std::vector<WeightRecipe> weight_recipes() {
  std::vector<WeightRecipe> out;
  for (const auto& r : all_recipes())
    if (std::find(out.begin(), out.end(), r.weight) == out.end()) out.push_back(r.weight);
  return out;
}
std::vector<ActivationRecipe> activation_recipes() {
  std::vector<ActivationRecipe> out;
  for (const auto& r : all_recipes())
    if (std::find(out.begin(), out.end(), r.activation) == out.end()) out.push_back(r.activation);
  out.push_back(ActivationRecipe::per_token_group(32, true));
  out.push_back(ActivationRecipe::per_token(true));
  return out;
}

// The scale that covers (row, col), decoded, from any layout.
double scale_at(const WeightRecipe& r, const TensorView& s, int64_t n, int64_t k, int64_t row, int64_t col) {
  const int64_t scols = r.scale_cols(k);
  int64_t sr = 0, sc = 0;
  if (r.granularity == WeightGranularity::PerChannel) sr = row;
  if (r.granularity == WeightGranularity::Block) sr = row / r.block_n, sc = col / r.block_k;
  if (r.granularity == WeightGranularity::MX) sr = row, sc = col / 32;
  (void)n;
  switch (r.scale_format) {
    case ScaleFormat::FP32: return s.ptr<float>()[sr * scols + sc];
    case ScaleFormat::UE8M0: return fmt::ue8m0_to_float(s.ptr<uint8_t>()[sr * scols + sc]);
    case ScaleFormat::UE8M0_PACKED:
      return fmt::ue8m0_to_float(fmt::ue8m0_unpack(s.ptr<int32_t>()[sr * ((scols + 3) / 4) + sc / 4], static_cast<int>(sc % 4)));
  }
  return NAN;
}

// ===== Weights ==================================================================================================

TEST(ReferenceQuantizeWeights, EveryRecipeScaleShapeAndErrorBound) {
  const int64_t n = 96, k = 256;  // 96: a ragged last block for 64- and 128-row blocks
  for (const WeightRecipe& r : weight_recipes()) {
    SCOPED_TRACE(r.name());
    for (DType in_dtype : {DType::F32, DType::BF16}) {
      Buffer w = testing::random_tensor(in_dtype, {n, k}, 0.05f);
      for (int64_t c = 0; c < 32; ++c) testing::set(w.view, c, 0.0f);  // an all-zero group (MX) in row 0
      const bool fp4 = r.element == ElementType::FP4_E2M1;
      Buffer q(fp4 ? DType::U8 : DType::F8_E4M3, {n, weight_storage_cols(r, k)});
      Buffer s(weight_scale_dtype(r), weight_scale_shape(r, n, k));
      poison(q.view);
      poison(s.view);
      ASSERT_NO_THROW(validate_quantize_weights(w, r, q, s));
      cpu::reference_quantize_weights(w, r, q, s);

      // Per scale block: s = amax / max (UE8M0: the next power of two), and every element within half an ulp.
      const double element_max = fp4 ? 6.0 : 448.0;
      std::map<std::pair<int64_t, int64_t>, double> amax;
      auto block_of = [&](int64_t row, int64_t col) -> std::pair<int64_t, int64_t> {
        switch (r.granularity) {
          case WeightGranularity::PerTensor: return {0, 0};
          case WeightGranularity::PerChannel: return {row, 0};
          case WeightGranularity::Block: return {row / r.block_n, col / r.block_k};
          case WeightGranularity::MX: return {row, col / 32};
        }
        return {0, 0};
      };
      for (int64_t row = 0; row < n; ++row)
        for (int64_t col = 0; col < k; ++col)
          amax[block_of(row, col)] = std::max(amax[block_of(row, col)], std::fabs(double(get(w, row * k + col))));
      Buffer deq(DType::F32, {n, k});
      poison(deq.view);
      cpu::reference_dequantize_weights(q, s, r, deq);
      for (int64_t row = 0; row < n; ++row) {
        for (int64_t col = 0; col < k; ++col) {
          const double scale = scale_at(r, s, n, k, row, col);
          const double a = amax[block_of(row, col)];
          const double exact = a == 0.0 ? 1.0 : double(float(a) / float(element_max));
          if (r.scale_format == ScaleFormat::FP32) {
            ASSERT_EQ(scale, exact) << "row " << row << " col " << col;
          } else {
            ASSERT_TRUE(scale >= exact && scale < 2 * exact) << "row " << row << " col " << col << ": " << scale;
          }
          const double v = get(w, row * k + col);
          const double d = get(deq, row * k + col);
          // Slack: the reference divides w / s in float.
          ASSERT_LE(std::fabs(v - d), half_ulp(r.element, v / scale) * scale + std::ldexp(std::fabs(v), -22))
              << "row " << row << " col " << col << " w " << v << " deq " << d;
        }
      }
      if (r.scale_format == ScaleFormat::UE8M0_PACKED) {
        // K = 256 with 128-wide blocks: 2 scales per int32, bytes 2 and 3 are padding (127 = 1.0).
        for (int64_t i = 0; i < s.numel(); ++i) {
          EXPECT_EQ(fmt::ue8m0_unpack(s.ptr<int32_t>()[i], 2), 127);
          EXPECT_EQ(fmt::ue8m0_unpack(s.ptr<int32_t>()[i], 3), 127);
        }
      }
    }
  }
}

TEST(ReferenceQuantizeWeights, RoundTripOfRepresentableWeightsIsExact) {
  const int64_t n = 72, k = 128;
  for (const WeightRecipe& r : weight_recipes()) {
    SCOPED_TRACE(r.name());
    const Weight built = make_weight(r, -1, n, k, r.element == ElementType::FP4_E2M1 ? -3 : -8, /*force_max=*/true);
    // Dequantize: exact in F32 and BF16 (at most 7 significant bits).
    for (DType dtype : {DType::F32, DType::BF16}) {
      Buffer deq(dtype, {n, k});
      poison(deq.view);
      cpu::reference_dequantize_weights(built.codes, built.scales, r, deq);
      for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(double(get(deq, i)), built.dense[i]) << "element " << i;
      // Quantize again: the same codes and scales, bit for bit.
      Buffer q(built.codes.view.dtype, built.codes.view.sizes()), s(built.scales.view.dtype, built.scales.view.sizes());
      poison(q.view);
      poison(s.view);
      cpu::reference_quantize_weights(deq, r, q, s);
      ASSERT_EQ(q.bytes, built.codes.bytes);
      ASSERT_EQ(s.bytes, built.scales.bytes);
    }
  }
}

TEST(ReferenceQuantizeWeights, AllZeroBlockGetsScaleOne) {
  Buffer w(DType::F32, {4, 64});
  for (const auto& r : {WeightRecipe::block(2, 32, ScaleFormat::FP32), WeightRecipe::block(2, 32, ScaleFormat::UE8M0),
                        WeightRecipe::mxfp4(ScaleFormat::FP32), WeightRecipe::per_tensor()}) {
    Buffer q(r.element == ElementType::FP4_E2M1 ? DType::U8 : DType::F8_E4M3, {4, weight_storage_cols(r, 64)});
    Buffer s(weight_scale_dtype(r), weight_scale_shape(r, 4, 64));
    cpu::reference_quantize_weights(w, r, q, s);
    for (int64_t i = 0; i < s.numel(); ++i) {
      if (r.scale_format == ScaleFormat::FP32) EXPECT_EQ(s.ptr<float>()[i], 1.0f) << r.name();
      else EXPECT_EQ(s.ptr<uint8_t>()[i], 127) << r.name();
    }
    for (uint8_t b : q.bytes) EXPECT_EQ(b, 0);
  }
}

TEST(ReferenceQuantizeWeights, Fp4PacksLowNibbleFirst) {
  // One row of 32: w = [1, -6, 0.5, 3, 0, ...] with scale 1 (amax 6 → s = 1).
  Buffer w(DType::F32, {1, 32});
  const float row[4] = {1.0f, -6.0f, 0.5f, 3.0f};
  for (int i = 0; i < 4; ++i) w.ptr<float>()[i] = row[i];
  const WeightRecipe r = WeightRecipe::mxfp4(ScaleFormat::UE8M0);
  Buffer q(DType::U8, {1, 16}), s(DType::F8_E8M0, {1, 1});
  cpu::reference_quantize_weights(w, r, q, s);
  EXPECT_EQ(s.ptr<uint8_t>()[0], 127);
  EXPECT_EQ(q.ptr<uint8_t>()[0], 0xF2);  // low: 1.0 (0x2), high: -6 (0xF)
  EXPECT_EQ(q.ptr<uint8_t>()[1], 0x51);  // low: 0.5 (0x1), high: 3.0 (0x5)
}

// ===== Activations ==============================================================================================

TEST(ReferenceQuantizeActivations, EveryRecipeScalesAndErrorBound) {
  const int64_t m = 5, k = 256;
  for (const ActivationRecipe& r : activation_recipes()) {
    SCOPED_TRACE(r.name());
    Buffer x = testing::random_tensor(DType::BF16, {m, k}, 2.0f);
    for (int64_t c = 0; c < k; ++c) testing::set(x.view, 2 * k + c, 0.0f);  // row 2 all zero
    Buffer q(DType::F8_E4M3, {m, k}), s(DType::F32, activation_scale_shape(r, m, k));
    poison(q.view);
    if (r.is_static()) s.ptr<float>()[0] = 3.0f / 448.0f;
    else poison(s.view);
    ASSERT_NO_THROW(validate_quantize_activations(x, r, q, s));
    cpu::reference_quantize_activations(x, r, q, s);

    const int64_t group = r.granularity == ActGranularity::PerTokenGroup ? r.group_size : k;
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t g = 0; g < k / group; ++g) {
        float amax = 0;
        for (int64_t c = g * group; c < (g + 1) * group; ++c) amax = std::max(amax, std::fabs(get(x, row * k + c)));
        const float scale = r.is_static() ? s.ptr<float>()[0] : s.ptr<float>()[row * (k / group) + g];
        if (!r.is_static()) {
          const float exact = std::max(amax, 1e-4f) / 448.0f;
          if (r.pow2_scale) {
            ASSERT_TRUE(fmt::is_pow2(scale) && scale >= exact && scale < 2 * exact) << scale;
          } else {
            ASSERT_EQ(scale, exact) << "row " << row << " group " << g;
          }
        }
        for (int64_t c = g * group; c < (g + 1) * group; ++c) {
          const double v = get(x, row * k + c);
          const double d = double(get(q, row * k + c)) * scale;
          if (std::fabs(v) > 448.0 * scale) {  // static: saturates
            ASSERT_EQ(std::fabs(d), 448.0 * scale);
          } else {
            ASSERT_LE(std::fabs(v - d), half_ulp(ElementType::FP8_E4M3, v / scale) * scale + std::ldexp(std::fabs(v), -22))
                << "row " << row << " col " << c;
          }
          if (!r.is_static() && !r.pow2_scale && amax > 0 && std::fabs(float(v)) == amax)
            ASSERT_EQ(std::fabs(get(q, row * k + c)), 448.0f);  // the group's amax maps to ±448
        }
      }
    }
  }
}

// ===== Linear ===================================================================================================

// x [m, k] whose quantization per the recipe is lossless: per scale group one element of ±448 and a
// power-of-two scale (dynamic), or code · s for the static s.
struct Activations {
  Buffer x, codes, scales;  // x: F32; codes/scales: the pre-quantized form
  std::vector<double> dense;
};
Activations make_activations(const ActivationRecipe& r, int64_t m, int64_t k, float static_scale) {
  Activations a{Buffer(DType::F32, {m, k}), Buffer(DType::F8_E4M3, {m, k}),
                Buffer(DType::F32, activation_scale_shape(r, m, k)), {}};
  a.dense.resize(static_cast<size_t>(m * k));
  const int64_t group = r.granularity == ActGranularity::PerTokenGroup ? r.group_size : k;
  if (r.is_static()) a.scales.ptr<float>()[0] = static_scale;
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t g = 0; g < k / group; ++g) {
      const float s = r.is_static() ? static_scale : std::ldexp(1.0f, rand_int(-8, 0));
      if (!r.is_static()) a.scales.ptr<float>()[row * (k / group) + g] = s;
      const int64_t max_at = g * group + rand_int(0, static_cast<int>(group) - 1);
      for (int64_t c = g * group; c < (g + 1) * group; ++c) {
        const uint8_t code = (!r.is_static() && c == max_at) ? (rand_int(0, 1) ? 0x7E : 0xFE) : random_e4m3_code();
        a.codes.ptr<uint8_t>()[row * k + c] = code;
        a.dense[row * k + c] = double(fmt::e4m3_to_float(code)) * s;
        a.x.ptr<float>()[row * k + c] = static_cast<float>(a.dense[row * k + c]);
      }
    }
  }
  return a;
}

TEST(ReferenceLinear, ExactProductOnRepresentableDataForEveryRecipe) {
  const int64_t m = 3, n = 40, k = 256;  // 40: ragged last block for every block height
  for (const NamedRecipe& recipe : all_recipes()) {
    SCOPED_TRACE(recipe.name);
    const WeightRecipe& wr = recipe.weight;
    const ActivationRecipe& ar = recipe.activation;
    const Weight w = make_weight(wr, -1, n, k, wr.element == ElementType::FP4_E2M1 ? -1 : -5, false);
    const Activations x = make_activations(ar, m, k, 0.375f);
    Buffer bias(DType::F32, {n});
    for (int64_t i = 0; i < n; ++i) bias.ptr<float>()[i] = 0.5f * rand_int(-8, 8);

    for (bool prequantized : {false, true}) {
      for (bool with_bias : {false, true}) {
        LinearArgs args;
        args.x = prequantized ? x.codes.view : x.x.view;
        if (prequantized || ar.is_static()) args.x_scale = x.scales;
        args.activation = ar;
        args.weight = w.codes;
        args.weight_scale = w.scales;
        args.weight_recipe = wr;
        if (with_bias) args.bias = bias;
        Buffer out(DType::F32, {m, n});
        poison(out.view);
        args.out = out;
        ASSERT_NO_THROW(validate_linear(args));
        cpu::reference_linear(args);
        for (int64_t row = 0; row < m; ++row) {
          for (int64_t col = 0; col < n; ++col) {
            double exact = with_bias ? bias.ptr<float>()[col] : 0.0;  // every partial sum is exact in double
            for (int64_t c = 0; c < k; ++c) exact += x.dense[row * k + c] * w.dense[col * k + c];
            ASSERT_EQ(out.ptr<float>()[row * n + col], static_cast<float>(exact))
                << "prequantized " << prequantized << " bias " << with_bias << " at [" << row << ", " << col << "]";
          }
        }
      }
    }
  }
}

TEST(ReferenceLinear, OutputDtypesRoundOnceToNearestEven) {
  const WeightRecipe wr = WeightRecipe::block(128, 128, ScaleFormat::FP32);
  const ActivationRecipe ar = ActivationRecipe::per_token_group(128);
  const int64_t m = 4, n = 16, k = 256;
  const Weight w = make_weight(wr, -1, n, k, -5, false);
  const Activations x = make_activations(ar, m, k, 1.0f);
  Buffer bias = testing::random_tensor(DType::BF16, {n});
  for (DType dtype : {DType::BF16, DType::F16}) {
    LinearArgs args;
    args.x = x.x;
    args.activation = ar;
    args.weight = w.codes;
    args.weight_scale = w.scales;
    args.weight_recipe = wr;
    args.bias = bias;
    Buffer out(dtype, {m, n});
    poison(out.view);
    args.out = out;
    cpu::reference_linear(args);
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t col = 0; col < n; ++col) {
        double exact = get(bias, col);
        for (int64_t c = 0; c < k; ++c) exact += x.dense[row * k + c] * w.dense[col * k + c];
        const double got = get(out, row * n + col);
        // Past F16's largest finite value by half its last step (65504 + 16) the nearest even is infinity. Random
        // data reaches it now and then (|exact| ~ 7.6e4 in one seed).
        if (dtype == DType::F16 && std::fabs(exact) >= 65520.0) {
          ASSERT_TRUE(std::isinf(got) && std::signbit(got) == std::signbit(exact)) << exact << " gave " << got;
          continue;
        }
        // The two representable neighbours of `exact`: got must be the nearer one.
        const uint16_t code = static_cast<uint16_t*>(out.view.data)[row * n + col];
        auto decode = [&](uint16_t c) {
          return double(dtype == DType::BF16 ? fmt::bf16_to_float(c) : fmt::f16_to_float(c));
        };
        const double up = decode(static_cast<uint16_t>(code + 1)), down = decode(static_cast<uint16_t>(code - 1));
        ASSERT_LE(std::fabs(got - exact), std::fabs(up - exact)) << exact;
        ASSERT_LE(std::fabs(got - exact), std::fabs(down - exact)) << exact;
      }
    }
  }
}

// ===== MoE ======================================================================================================

// A definition of the MoE block written token-major (the reference is expert-major).
std::vector<double> qdq(const std::vector<float>& x, const ActivationRecipe& r, float static_scale) {
  const int64_t k = static_cast<int64_t>(x.size());
  const int64_t group = r.granularity == ActGranularity::PerTokenGroup ? r.group_size : k;
  std::vector<double> out(x.size());
  for (int64_t g0 = 0; g0 < k; g0 += group) {
    float s = static_scale;
    if (!r.is_static()) {
      float amax = 0;
      for (int64_t c = g0; c < g0 + group; ++c) amax = std::max(amax, std::fabs(x[c]));
      s = std::max(amax, 1e-4f) / 448.0f;
      if (r.pow2_scale) s = fmt::pow2_ceil(s);
    }
    for (int64_t c = g0; c < g0 + group; ++c) out[c] = double(fmt::e4m3_to_float(fmt::e4m3_from_float(x[c] / s))) * s;
  }
  return out;
}

struct MoeProblem {
  int64_t tokens, hidden, inter, experts, top_k;
  WeightRecipe weight_recipe;
  ActivationRecipe act_recipe;
  MoeActivation activation = MoeActivation::SwiGLU;
  float limit = 0.0f, alpha = 1.702f;
  bool interleaved = false;
  bool biases = false;
  DType index_dtype = DType::I32;

  Buffer x, index, weights, gate_up_act_scale, down_act_scale, gate_up_bias, down_bias;
  Weight gate_up, down;

  int64_t rows() const { return moe_activation_has_gate(activation) ? 2 * inter : inter; }

  void build() {
    x = testing::random_tensor(DType::BF16, {tokens, hidden});
    index = Buffer(index_dtype, {tokens, top_k});
    weights = testing::random_tensor(DType::F32, {tokens, top_k}, 0.5f);
    for (int64_t i = 0; i < tokens * top_k; ++i) set_index(i, rand_int(0, 5) == 0 ? -1 : rand_int(0, int(experts) - 1));
    const bool fp4 = weight_recipe.element == ElementType::FP4_E2M1;
    gate_up = make_weight(weight_recipe, experts, rows(), hidden, fp4 ? -4 : -10, false);
    down = make_weight(weight_recipe, experts, hidden, inter, fp4 ? -4 : -10, false);
    if (act_recipe.is_static()) {
      gate_up_act_scale = Buffer(DType::F32, {experts});
      down_act_scale = Buffer(DType::F32, {experts});
      for (int64_t e = 0; e < experts; ++e) {
        gate_up_act_scale.ptr<float>()[e] = (2.0f + float(e)) / 448.0f;
        down_act_scale.ptr<float>()[e] = (0.5f + 0.25f * float(e)) / 448.0f;
      }
    }
    if (biases) {
      gate_up_bias = testing::random_tensor(DType::F32, {experts, rows()}, 0.5f);
      down_bias = testing::random_tensor(DType::BF16, {experts, hidden}, 0.5f);
    }
  }

  void set_index(int64_t i, int64_t v) {
    if (index_dtype == DType::I32) index.ptr<int32_t>()[i] = static_cast<int32_t>(v);
    else index.ptr<int64_t>()[i] = v;
  }
  int64_t index_at(int64_t i) const {
    return index_dtype == DType::I32 ? static_cast<const int32_t*>(index.view.data)[i]
                                     : static_cast<const int64_t*>(index.view.data)[i];
  }

  MoeArgs args(const TensorView& out) const {
    MoeArgs a;
    a.hidden = x;
    a.top_k_index = index;
    a.top_k_weights = weights;
    a.gate_up = gate_up.codes;
    a.gate_up_scale = gate_up.scales;
    a.down = down.codes;
    a.down_scale = down.scales;
    a.weight_recipe = weight_recipe;
    a.activation_recipe = act_recipe;
    if (act_recipe.is_static()) {
      a.gate_up_act_scale = gate_up_act_scale;
      a.down_act_scale = down_act_scale;
    }
    if (biases) {
      a.gate_up_bias = gate_up_bias;
      a.down_bias = down_bias;
    }
    a.activation = activation;
    a.swiglu_limit = limit;
    a.swiglu_alpha = alpha;
    a.interleaved_gate_up = interleaved;
    a.out = out;
    return a;
  }

  double act(double gate, double up) const {
    auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    switch (activation) {
      case MoeActivation::SwiGLU:
      case MoeActivation::SwiGLUOai:
        if (limit > 0) {
          gate = std::min(gate, double(limit));
          up = std::min(std::max(up, -double(limit)), double(limit));
        }
        if (activation == MoeActivation::SwiGLU) return silu(gate) * up;
        return (up + 1.0) * gate * (1.0 / (1.0 + std::exp(-double(alpha) * gate)));
      case MoeActivation::Silu: return silu(up);
      case MoeActivation::Gelu: return 0.5 * up * (1.0 + std::tanh(0.7978845608028654 /* sqrt(2/pi) */ * (up + 0.044715 * up * up * up)));
      case MoeActivation::Relu2: return up > 0 ? up * up : 0.0;
    }
    return NAN;
  }

  std::vector<double> expected() const {
    const int64_t h = hidden, i_dim = inter, r = rows();
    std::vector<double> out(static_cast<size_t>(tokens * h), 0.0);
    std::vector<float> row(static_cast<size_t>(h)), mid(static_cast<size_t>(i_dim));
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t c = 0; c < h; ++c) row[c] = get(x, t * h + c);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t e = index_at(t * top_k + j);
        if (e < 0) continue;
        const std::vector<double> xq = qdq(row, act_recipe, act_recipe.is_static() ? gate_up_act_scale.view.ptr<float>()[e] : 0.0f);
        std::vector<double> proj(static_cast<size_t>(r));
        for (int64_t o = 0; o < r; ++o) {
          double acc = 0;
          for (int64_t c = 0; c < h; ++c) acc += gate_up.dense[(e * r + o) * h + c] * xq[c];
          proj[o] = acc + (biases ? double(get(gate_up_bias, e * r + o)) : 0.0);
        }
        for (int64_t i = 0; i < i_dim; ++i) {
          if (!moe_activation_has_gate(activation)) mid[i] = float(act(0.0, proj[i]));
          else if (interleaved) mid[i] = float(act(proj[2 * i], proj[2 * i + 1]));
          else mid[i] = float(act(proj[i], proj[i_dim + i]));
        }
        const std::vector<double> mq = qdq(mid, act_recipe, act_recipe.is_static() ? down_act_scale.view.ptr<float>()[e] : 0.0f);
        const double w = get(weights, t * top_k + j);
        for (int64_t c = 0; c < h; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < i_dim; ++i) acc += down.dense[(e * h + c) * i_dim + i] * mq[i];
          out[t * h + c] += w * (acc + (biases ? double(get(down_bias, e * h + c)) : 0.0));
        }
      }
    }
    return out;
  }

  void check(DType out_dtype = DType::F32) const {
    Buffer out(out_dtype, {tokens, hidden});
    poison(out.view);
    const MoeArgs a = args(out);
    ASSERT_NO_THROW(validate_moe(a));
    cpu::reference_moe(a);
    const std::vector<double> ref = expected();
    double norm = 0;
    for (double v : ref) norm = std::max(norm, std::fabs(v));
    const double tol = (out_dtype == DType::F32 ? 1e-6 : 8e-3);
    const double abs_tol = 1e-9 * norm + (out_dtype == DType::F32 ? 0.0 : 1e-7);  // f16 subnormals
    for (int64_t i = 0; i < tokens * hidden; ++i) {
      const double got = get(out, i);
      ASSERT_TRUE(std::isfinite(got)) << "element " << i;
      ASSERT_LE(std::fabs(got - ref[i]), tol * std::fabs(ref[i]) + abs_tol) << "element " << i << " ref " << ref[i];
    }
  }
};

TEST(ReferenceMoe, HandCheckedRouting) {
  // H=4, I=2, no gate (relu²), per-tensor weights with scale 1, per-token pow2 activations: every step is exact.
  // Expert 0: up = (x0, x1), y = (a0, a1, 0, 0); expert 1: up = (x2, x3), y = (0, 0, a0, a1);
  // expert 2: up = (x0 + x1, x2 - x3), y = (a0, a0, a1, a1); expert 3 is never chosen.
  const float gate_up[4][2][4] = {{{1, 0, 0, 0}, {0, 1, 0, 0}}, {{0, 0, 1, 0}, {0, 0, 0, 1}},
                                  {{1, 1, 0, 0}, {0, 0, 1, -1}}, {{448, 448, 448, 448}, {448, 448, 448, 448}}};
  const float down[4][4][2] = {{{1, 0}, {0, 1}, {0, 0}, {0, 0}}, {{0, 0}, {0, 0}, {1, 0}, {0, 1}},
                               {{1, 0}, {1, 0}, {0, 1}, {0, 1}}, {{448, 448}, {448, 448}, {448, 448}, {448, 448}}};
  const float x[4][4] = {{1, 2, 3, -1}, {-2, 1, 0, 2}, {0.5f, 0.5f, 1, 1}, {1, 1, 1, 1}};
  const int64_t index[4][2] = {{0, 2}, {1, -1}, {-1, -1}, {2, 0}};
  const float weights[4][2] = {{0.5f, 0.25f}, {1, 7}, {3, 3}, {1, 2}};
  // t0: e0 → a = (1, 4), y = (1, 4, 0, 0); e2 → up = (3, 4), a = (9, 16), y = (9, 9, 16, 16).
  // t1: e1 → up = (0, 2), a = (0, 4), y = (0, 0, 0, 4). t2: nothing. t3: e2 → (4, 4, 0, 0); e0 → (1, 1, 0, 0) · 2.
  const float expected[4][4] = {{2.75f, 4.25f, 4, 4}, {0, 0, 0, 4}, {0, 0, 0, 0}, {6, 6, 0, 0}};

  for (DType index_dtype : {DType::I32, DType::I64}) {
    Buffer gu(DType::F8_E4M3, {4, 2, 4}), gus(DType::F32, {4}), dn(DType::F8_E4M3, {4, 4, 2}), dns(DType::F32, {4});
    for (int e = 0; e < 4; ++e) {
      gus.ptr<float>()[e] = dns.ptr<float>()[e] = 1.0f;
      for (int i = 0; i < 8; ++i) gu.ptr<uint8_t>()[e * 8 + i] = fmt::e4m3_from_float((&gate_up[e][0][0])[i]);
      for (int i = 0; i < 8; ++i) dn.ptr<uint8_t>()[e * 8 + i] = fmt::e4m3_from_float((&down[e][0][0])[i]);
    }
    Buffer hidden(DType::F32, {4, 4}), idx(index_dtype, {4, 2}), w(DType::F32, {4, 2}), out(DType::F32, {4, 4});
    std::memcpy(hidden.ptr<float>(), x, sizeof(x));
    std::memcpy(w.ptr<float>(), weights, sizeof(weights));
    for (int i = 0; i < 8; ++i) {
      if (index_dtype == DType::I32) idx.ptr<int32_t>()[i] = static_cast<int32_t>((&index[0][0])[i]);
      else idx.ptr<int64_t>()[i] = (&index[0][0])[i];
    }
    poison(out.view);
    MoeArgs a;
    a.hidden = hidden;
    a.top_k_index = idx;
    a.top_k_weights = w;
    a.gate_up = gu;
    a.gate_up_scale = gus;
    a.down = dn;
    a.down_scale = dns;
    a.weight_recipe = WeightRecipe::per_tensor();
    a.activation_recipe = ActivationRecipe::per_token(true);
    a.activation = MoeActivation::Relu2;
    a.out = out;
    ASSERT_NO_THROW(validate_moe(a));
    cpu::reference_moe(a);
    for (int t = 0; t < 4; ++t)
      for (int c = 0; c < 4; ++c) EXPECT_EQ(out.ptr<float>()[t * 4 + c], expected[t][c]) << "token " << t << " col " << c;
  }
}

TEST(ReferenceMoe, HandCheckedSwiGLUWithBiasAndStaticScales) {
  // H=2, I=1, one expert, per-tensor weights, static scales of 1: gate = x0 + 1 (bias), up = x1 - 0.5 (bias).
  // x = (2, 4): gate = 3, up = 3.5 → silu(3)·3.5; with limit 2: gate = 2, up = 2 → silu(2)·2.
  // The intermediate is requantized with scale 1 (E4M3 of the float value); y = (m, -m) + (0.25, 0).
  for (float limit : {0.0f, 2.0f}) {
    Buffer gu(DType::F8_E4M3, {1, 2, 2}), gus(DType::F32, {1}), dn(DType::F8_E4M3, {1, 2, 1}), dns(DType::F32, {1});
    const float gate_up[4] = {1, 0, 0, 1}, down[2] = {1, -1};
    for (int i = 0; i < 4; ++i) gu.ptr<uint8_t>()[i] = fmt::e4m3_from_float(gate_up[i]);
    for (int i = 0; i < 2; ++i) dn.ptr<uint8_t>()[i] = fmt::e4m3_from_float(down[i]);
    gus.ptr<float>()[0] = dns.ptr<float>()[0] = 1.0f;
    Buffer hidden(DType::F32, {1, 2}), idx(DType::I32, {1, 1}), w(DType::F32, {1, 1}), out(DType::F32, {1, 2});
    hidden.ptr<float>()[0] = 2.0f;
    hidden.ptr<float>()[1] = 4.0f;
    idx.ptr<int32_t>()[0] = 0;
    w.ptr<float>()[0] = 1.0f;
    Buffer gub(DType::F32, {1, 2}), dnb(DType::F32, {1, 2}), act_scale(DType::F32, {1});
    gub.ptr<float>()[0] = 1.0f;
    gub.ptr<float>()[1] = -0.5f;
    dnb.ptr<float>()[0] = 0.25f;
    act_scale.ptr<float>()[0] = 1.0f;
    poison(out.view);
    MoeArgs a;
    a.hidden = hidden;
    a.top_k_index = idx;
    a.top_k_weights = w;
    a.gate_up = gu;
    a.gate_up_scale = gus;
    a.down = dn;
    a.down_scale = dns;
    a.weight_recipe = WeightRecipe::per_tensor();
    a.activation_recipe = ActivationRecipe::static_per_tensor();
    a.gate_up_act_scale = act_scale;
    a.down_act_scale = act_scale;
    a.gate_up_bias = gub;
    a.down_bias = dnb;
    a.swiglu_limit = limit;
    a.out = out;
    ASSERT_NO_THROW(validate_moe(a));
    cpu::reference_moe(a);
    const double gate = limit > 0 ? 2.0 : 3.0, up = limit > 0 ? 2.0 : 3.5;
    const float mid = static_cast<float>(gate / (1 + std::exp(-gate)) * up);
    const double m = fmt::e4m3_to_float(fmt::e4m3_from_float(mid));
    EXPECT_EQ(out.ptr<float>()[0], static_cast<float>(m + 0.25)) << "limit " << limit;
    EXPECT_EQ(out.ptr<float>()[1], static_cast<float>(-m)) << "limit " << limit;
  }
}

TEST(ReferenceMoe, EveryRecipeMatchesTokenMajorDefinition) {
  for (const NamedRecipe& recipe : all_recipes()) {
    SCOPED_TRACE(recipe.name);
    MoeProblem p{6, 256, 128, 4, 3, recipe.weight, recipe.activation};
    p.biases = rand_int(0, 1) == 1;
    p.build();
    p.check();
  }
}

TEST(ReferenceMoe, EveryActivationKindLayoutAndOutputDtype) {
  const MoeActivation kinds[] = {MoeActivation::SwiGLU, MoeActivation::SwiGLUOai, MoeActivation::Silu,
                                 MoeActivation::Gelu, MoeActivation::Relu2};
  for (MoeActivation kind : kinds) {
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string(moe_activation_name(kind)) + " variant " + std::to_string(variant));
      MoeProblem p{5, 64, 32, 3, 2, WeightRecipe::block(32, 32), ActivationRecipe::per_token_group(32)};
      p.activation = kind;
      const bool gated = moe_activation_has_gate(kind);
      p.limit = (variant & 1) && gated ? 0.75f : 0.0f;
      p.interleaved = (variant & 2) && gated;
      p.biases = variant >= 2;
      p.index_dtype = variant == 3 ? DType::I64 : DType::I32;
      p.build();
      p.check(DType::F32);
      p.check(DType::BF16);
      p.check(DType::F16);
    }
  }
}

TEST(ReferenceMoe, InterleavedLayoutEqualsSplitLayout) {
  // The same experts stored split (gate rows then up rows) and interleaved (even/odd rows): the same bits.
  MoeProblem p{7, 64, 32, 3, 2, WeightRecipe::per_channel(), ActivationRecipe::per_token()};
  p.activation = MoeActivation::SwiGLUOai;
  p.limit = 7.0f;
  p.biases = true;
  p.build();
  Buffer split_out(DType::F32, {p.tokens, p.hidden}), inter_out(DType::F32, {p.tokens, p.hidden});
  poison(split_out.view);
  cpu::reference_moe(p.args(split_out));

  MoeProblem q = p;
  q.interleaved = true;
  const int64_t rows = p.rows(), h = p.hidden, i_dim = p.inter;
  for (int64_t e = 0; e < p.experts; ++e) {
    for (int64_t i = 0; i < i_dim; ++i) {
      for (int half = 0; half < 2; ++half) {
        const int64_t from = half * i_dim + i, to = 2 * i + half;
        std::memcpy(q.gate_up.codes.ptr<uint8_t>() + (e * rows + to) * h, p.gate_up.codes.ptr<uint8_t>() + (e * rows + from) * h, h);
        q.gate_up.scales.ptr<float>()[e * rows + to] = p.gate_up.scales.ptr<float>()[e * rows + from];
        q.gate_up_bias.ptr<float>()[e * rows + to] = p.gate_up_bias.ptr<float>()[e * rows + from];
      }
    }
  }
  q.gate_up.codes.view.data = q.gate_up.codes.bytes.data();
  q.gate_up.scales.view.data = q.gate_up.scales.bytes.data();
  q.gate_up_bias.view.data = q.gate_up_bias.bytes.data();
  poison(inter_out.view);
  const MoeArgs qa = q.args(inter_out);
  ASSERT_NO_THROW(validate_moe(qa));
  cpu::reference_moe(qa);
  EXPECT_EQ(split_out.bytes, inter_out.bytes);
}

TEST(ReferenceMoe, OneExpertTakesEveryTokenAndEmptyExperts) {
  MoeProblem p{9, 64, 32, 5, 2, WeightRecipe::block(32, 32, ScaleFormat::UE8M0), ActivationRecipe::per_token_group(32, true)};
  p.build();
  for (int64_t t = 0; t < p.tokens; ++t) {
    p.set_index(t * 2, 3);                     // expert 3 gets every token
    p.set_index(t * 2 + 1, t == 4 ? 3 : -1);   // and token 4 twice; experts 0, 1, 2, 4 stay empty
  }
  p.check();
  // Slots that are -1 contribute nothing whatever their weight; a token with no slot gives zeros.
  for (int64_t t = 0; t < p.tokens; ++t) p.set_index(t * 2, t % 2 ? -1 : 3);
  Buffer out(DType::F32, {p.tokens, p.hidden});
  poison(out.view);
  cpu::reference_moe(p.args(out));
  for (int64_t c = 0; c < p.hidden; ++c) EXPECT_EQ(out.ptr<float>()[1 * p.hidden + c], 0.0f);
  p.check();
}

TEST(ReferenceMoe, StaticScalesArePerExpert) {
  MoeProblem p{8, 128, 128, 3, 2, WeightRecipe::block(128, 128), ActivationRecipe::static_per_tensor()};
  p.build();
  p.check();
  // An unused expert's scale does not matter; a used expert's does.
  for (int64_t i = 0; i < p.tokens * p.top_k; ++i) p.set_index(i, p.index_at(i) == 2 ? 1 : p.index_at(i));
  Buffer before(DType::F32, {p.tokens, p.hidden}), after(DType::F32, {p.tokens, p.hidden});
  cpu::reference_moe(p.args(before));
  // NOTE: factors of 3, not powers of two: scaling s by 2^j shifts the E4M3 codes and changes nothing.
  p.gate_up_act_scale.ptr<float>()[2] *= 3.0f;
  p.down_act_scale.ptr<float>()[2] *= 3.0f;
  cpu::reference_moe(p.args(after));
  EXPECT_EQ(before.bytes, after.bytes);
  p.gate_up_act_scale.ptr<float>()[1] *= 3.0f;
  cpu::reference_moe(p.args(after));
  EXPECT_NE(before.bytes, after.bytes);
  p.check();
}

}  // namespace
}  // namespace finegemm
