// The division-free fast path of the CUDA activation quantizer (src/cuda/kernels/quant_activations.cuh), run on the
// host: its quotient (x·r corrected by one fma, Markstein's) is mirrored here step by step and its code compared with
// the definition, e4m3(x / s), on every E4M3 rounding boundary and its float neighbours, exhaustively over the
// interesting range of a few scales, on every bf16 pair (x, amax) of a wide range, and on random bits. The kernel
// declines per vector of eight (a NaN code sends the whole vector to the division), so agreement element by element
// is what makes the vector's bytes exact.
// The E4M3 conversion here is fmt::e4m3_from_float, the CPU reference's; the GPU tests compare the device's
// cvt.rn.satfinite.e4m3x2 with it byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/formats.hpp"
#include "testing.hpp"

namespace finegemm {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- The mirror of reciprocal_of_scale, quotient and quantize8_fast (one element).
struct Bounds {  // the reciprocal the kernel uses (NaN where it declines the scale)
  float r;
};
Bounds reciprocal_bounds(float s, bool exact) {
  const bool in_range = s >= (exact ? 0x1p-125f : 0x1p-90f) && s <= 0x1p125f;
  return {in_range ? 1.0f / s : bits_to_float(0x7FFFFFFFu)};
}

// The fast path's code for x, or -1 when it declines (the kernel then divides).
int fast_code(float x, float s, Bounds b, bool exact) {
  const float q0 = x * b.r;
  const float q = exact ? q0 : std::copysign(std::fma(std::fma(-q0, s, x), b.r, q0), x);
  const uint8_t code = fmt::e4m3_from_float(q);
  if ((code & 0x7F) == 0x7F) return -1;
  return code;
}

uint8_t exact_code(float x, float s) { return fmt::e4m3_from_float(x / s); }

struct Tally {
  int64_t checked = 0, declined = 0, wrong = 0;
  float first_x = 0, first_s = 0;
  void add(float x, float s, bool exact_scale) {
    const int fast = fast_code(x, s, reciprocal_bounds(s, exact_scale), exact_scale);
    ++checked;
    if (fast < 0) {
      ++declined;
      return;
    }
    if (static_cast<uint8_t>(fast) != exact_code(x, s) && wrong++ == 0) {
      first_x = x;
      first_s = s;
    }
  }
  void merge(const Tally& t) {
    if (wrong == 0 && t.wrong > 0) {
      first_x = t.first_x;
      first_s = t.first_s;
    }
    checked += t.checked;
    declined += t.declined;
    wrong += t.wrong;
  }
};

#define EXPECT_NO_WRONG(t)                                                                                        \
  EXPECT_EQ((t).wrong, 0) << "first: x=" << (t).first_x << " (0x" << std::hex << float_to_bits((t).first_x)       \
                          << ") s=" << std::dec << (t).first_s << " (0x" << std::hex << float_to_bits((t).first_s) \
                          << ")" << std::dec

// Scales the kernels meet: dynamic ones max(amax, 1e-4)/448 (rounded up to powers of two for UE8M0), and static
// checkpoint scales (anything positive, and nonsense).
std::vector<std::pair<float, bool>> scales_to_test() {
  std::vector<std::pair<float, bool>> scales;  // (s, power of two)
  for (float amax : {1e-4f, 3e-4f, 0.0173f, 0.5f, 1.0f, 2.0f, 3.7f, 7.0f, 448.0f, 1000.0f, 65504.0f, 3.3e38f}) {
    const float s = std::max(amax, 1e-4f) / fmt::kE4M3Max;
    scales.push_back({s, false});
    scales.push_back({fmt::pow2_ceil(s), true});
  }
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  for (int i = 0; i < 24; ++i) scales.push_back({std::ldexp(unit(testing::rng()), -30 + 3 * i), false});
  // Edges of the usable range, and scales outside it (the fast path must decline them all).
  for (float s : {0x1p-125f, 0x1.fffffep-126f, 0x1p125f, 0x1.000002p125f, 0x1p-149f, 0.0f, -1.0f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 3.0e38f})
    scales.push_back({s, false});
  return scales;
}

// The positive E4M3 values and the midpoints between neighbours (the rounding boundaries), with 464 (where an
// unsaturated conversion would overflow) and a few beyond.
std::vector<double> boundaries() {
  std::vector<double> b;
  for (int c = 0; c < 0x7E; ++c) {
    const double v0 = fmt::e4m3_to_float(static_cast<uint8_t>(c)), v1 = fmt::e4m3_to_float(static_cast<uint8_t>(c + 1));
    b.push_back(v0);
    b.push_back((v0 + v1) / 2);
  }
  for (double v : {448.0, 456.0, 464.0, 480.0, 1e6}) b.push_back(v);
  return b;
}

TEST(QuantFastPath, BoundariesAndTheirNeighboursForManyScales) {
  Tally tally;
  int64_t declined_unusable = 0, unusable = 0;
  for (const auto& [s, pow2] : scales_to_test()) {
    const bool usable = s >= 0x1p-125f && s <= 0x1p125f;
    for (const double boundary : boundaries()) {
      // x whose quotient x / s lies on or next to the boundary, in float steps of x.
      const float center = static_cast<float>(boundary * static_cast<double>(s));
      if (!std::isfinite(center)) continue;
      const uint32_t c = float_to_bits(center);
      for (int step = -64; step <= 64; ++step) {
        const int64_t b = static_cast<int64_t>(c) + step;
        if (b < 0 || b >= 0x7F800000) continue;
        for (const uint32_t sign : {0u, 0x80000000u}) {
          const float x = bits_to_float(static_cast<uint32_t>(b) | sign);
          if (usable) tally.add(x, s, pow2);
          else {
            ++unusable;
            declined_unusable += fast_code(x, s, reciprocal_bounds(s, pow2), pow2) < 0;
          }
        }
      }
    }
  }
  EXPECT_NO_WRONG(tally);
  EXPECT_EQ(declined_unusable, unusable) << "scales outside [2^-125, 2^125] must always take the division";
  EXPECT_GT(tally.checked, 1000000);
}

// Every float x with x / s in [2^-12, 2^10) (the whole E4M3 range, subnormals and saturation included; both signs
// behave alike, every step being symmetric), for a general scale, the smallest dynamic scale and a power of two.
TEST(QuantFastPath, ExhaustiveOverTheE4M3RangeOfThreeScales) {
  for (const auto& [scale, power_of_two] : {std::pair{3.7f / fmt::kE4M3Max, false},
                                            std::pair{1e-4f / fmt::kE4M3Max, false}, std::pair{0x1p-7f, true}}) {
    const float s = scale;  // plain variables for the OpenMP region
    const bool pow2 = power_of_two;
    const uint32_t first = float_to_bits(static_cast<float>(0x1p-12 * s));
    const uint32_t last = float_to_bits(static_cast<float>(0x1p10 * s));
    Tally tally;
#pragma omp parallel
    {
      Tally local;
#pragma omp for schedule(static)
      for (int64_t b = first; b <= static_cast<int64_t>(last); ++b)
        local.add(bits_to_float(static_cast<uint32_t>(b)), s, pow2);
#pragma omp critical
      tally.merge(local);
    }
    EXPECT_NO_WRONG(tally);
    EXPECT_EQ(tally.checked, int64_t{last} - first + 1);
    // The speed claim: inside its scale range the fast path declines nothing finite.
    EXPECT_EQ(tally.declined, 0) << "s=" << s;
  }
}

// bf16 activations put x / s exactly on E4M3 rounding boundaries (ties) often: x and the group's amax have 8-bit
// significands, s = amax / 448. Every positive bf16 amax in [2^-14, 2^16) (its dynamic scale, FP32 and rounded up to a
// power of two) against every bf16 x with |x| ≤ amax, both signs: exact and never declined.
TEST(QuantFastPath, EveryBf16AgainstEveryBf16DynamicScale) {
  std::vector<float> bf16;  // positive finite bf16 values, ascending
  for (uint32_t b = 0x0001; b < 0x7F80; ++b) bf16.push_back(fmt::bf16_to_float(static_cast<uint16_t>(b)));
  const auto first_amax = std::lower_bound(bf16.begin(), bf16.end(), 0x1p-14f) - bf16.begin();
  const auto end_amax = std::lower_bound(bf16.begin(), bf16.end(), 0x1p16f) - bf16.begin();
  Tally tally;
#pragma omp parallel
  {
    Tally local;
#pragma omp for schedule(dynamic, 16)
    for (int64_t a = first_amax; a < end_amax; ++a) {
      const float amax = bf16[static_cast<size_t>(a)];
      const float s = std::max(amax, 1e-4f) / fmt::kE4M3Max;
      for (int64_t i = 0; i <= a; ++i)
        for (const float x : {bf16[static_cast<size_t>(i)], -bf16[static_cast<size_t>(i)]}) {
          local.add(x, s, false);
          local.add(x, fmt::pow2_ceil(s), true);
        }
    }
#pragma omp critical
    tally.merge(local);
  }
  EXPECT_NO_WRONG(tally);
  EXPECT_EQ(tally.declined, 0);
  EXPECT_GT(tally.checked, 150000000);
}

TEST(QuantFastPath, RandomBitsAndSpecialValues) {
  auto& gen = testing::rng();
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> amax_exponent(-20.0f, 20.0f);
  Tally tally;
  int64_t nan_inputs = 0, nan_declined = 0;
  const float specials[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-126f, std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (int i = 0; i < (1 << 22); ++i) {
    // A dynamic scale from a random amax (half of them rounded up to a power of two), or random positive bits.
    float s;
    bool pow2 = false;
    switch (i % 3) {
      case 0: s = std::max(std::exp2(amax_exponent(gen)), 1e-4f) / fmt::kE4M3Max; break;
      case 1:
        s = fmt::pow2_ceil(std::max(std::exp2(amax_exponent(gen)), 1e-4f) / fmt::kE4M3Max);
        pow2 = true;
        break;
      default: s = bits_to_float(any_bits(gen) & 0x7FFFFFFFu); break;
    }
    if (!(s >= 0x1p-125f && s <= 0x1p125f)) continue;
    // x: random bits, a random quotient in the E4M3 range times s, or a special value.
    float x;
    switch (i % 5) {
      case 0: x = bits_to_float(any_bits(gen)); break;
      case 1: x = specials[any_bits(gen) % std::size(specials)]; break;
      default: {
        const float q = std::ldexp(1.0f + (any_bits(gen) >> 8) * 0x1p-24f, static_cast<int>(any_bits(gen) % 24) - 14);
        x = (any_bits(gen) & 1 ? -q : q) * s;
      }
    }
    if (std::isnan(x)) {
      ++nan_inputs;
      nan_declined += fast_code(x, s, reciprocal_bounds(s, pow2), pow2) < 0;
      continue;
    }
    tally.add(x, s, pow2);
  }
  EXPECT_NO_WRONG(tally);
  EXPECT_EQ(nan_declined, nan_inputs) << "NaN inputs must take the division (the old path's NaN code)";
  EXPECT_GT(tally.checked, 3000000);
}

}  // namespace
}  // namespace finegemm
