// Exhaustive tests of the element and scale formats (src/core/formats.hpp).
// Every encoder is compared with an independent brute-force search: decode every code with textbook
// arithmetic (ldexp, no bit tricks), pick the nearest value, break ties toward the even code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "testing.hpp"

namespace finegemm {
namespace {

using testing::rng;

// ---- Independent decoders.

// E4M3 (float8_e4m3fn): s1 e4 m3, bias 7; exponent 0 is subnormal (m · 2^-9); S.1111.111 is NaN.
double e4m3_value(uint8_t code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man, -9) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

// E2M1: s1 e2 m1, bias 1; exponent 0 is subnormal (m · 0.5).
double e2m1_value(uint8_t nibble) {
  const int sign = (nibble >> 3) & 1, exp = (nibble >> 1) & 3, man = nibble & 1;
  const double mag = exp == 0 ? man * 0.5 : std::ldexp(1.0 + man / 2.0, exp - 1);
  return sign ? -mag : mag;
}

double bf16_value(uint16_t code) {
  const int sign = code >> 15, exp = (code >> 7) & 0xFF, man = code & 0x7F;
  double mag;
  if (exp == 0xFF) mag = man ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (exp == 0) mag = std::ldexp(man, -133);  // m · 2^-126 / 2^7
  else mag = std::ldexp(1.0 + man / 128.0, exp - 127);
  return sign ? -mag : mag;
}

double f16_value(uint16_t code) {
  const int sign = code >> 15, exp = (code >> 10) & 0x1F, man = code & 0x3FF;
  double mag;
  if (exp == 0x1F) mag = man ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (exp == 0) mag = std::ldexp(man, -24);
  else mag = std::ldexp(1.0 + man / 1024.0, exp - 15);
  return sign ? -mag : mag;
}

// ---- Brute-force nearest: over a table of (non-negative value, code) pairs, sorted by value.
struct Candidate {
  double value;
  uint32_t code;
};

// The nearest candidate to a ≥ 0; on a tie, the one with an even code (its last mantissa bit clear).
uint32_t nearest(const std::vector<Candidate>& table, double a) {
  uint32_t best = table[0].code;
  double best_dist = INFINITY;
  for (const Candidate& c : table) {
    const double d = std::fabs(c.value - a);
    if (d < best_dist || (d == best_dist && (c.code & 1u) == 0)) {
      best = c.code;
      best_dist = d;
    }
  }
  return best;
}

// Same, by binary search (for the 16-bit formats, whose tables are long).
uint32_t nearest_sorted(const std::vector<Candidate>& table, double a) {
  auto it = std::lower_bound(table.begin(), table.end(), a, [](const Candidate& c, double v) { return c.value < v; });
  if (it == table.end()) return table.back().code;
  if (it == table.begin()) return it->code;
  const Candidate& hi = *it;
  const Candidate& lo = *(it - 1);
  const double dlo = a - lo.value, dhi = hi.value - a;
  if (dlo < dhi) return lo.code;
  if (dhi < dlo) return hi.code;
  return (lo.code & 1u) == 0 ? lo.code : hi.code;
}

std::vector<Candidate> e4m3_table() {
  std::vector<Candidate> t;
  for (uint32_t c = 0; c < 0x80; ++c)
    if (!std::isnan(e4m3_value(static_cast<uint8_t>(c)))) t.push_back({e4m3_value(static_cast<uint8_t>(c)), c});
  return t;
}

std::vector<Candidate> e2m1_table() {
  std::vector<Candidate> t;
  for (uint32_t c = 0; c < 8; ++c) t.push_back({e2m1_value(static_cast<uint8_t>(c)), c});
  return t;
}

// Every non-negative finite 16-bit value, plus +inf at the first power of two past the largest finite
// value: IEEE rounding treats overflow as rounding to that value (so x ≥ max + ulp/2 gives inf).
template <typename Decode>
std::vector<Candidate> ieee16_table(Decode decode, uint32_t inf_code, double inf_position) {
  std::vector<Candidate> t;
  for (uint32_t c = 0; c < inf_code; ++c) t.push_back({decode(static_cast<uint16_t>(c)), c});
  t.push_back({inf_position, inf_code});
  std::sort(t.begin(), t.end(), [](const Candidate& a, const Candidate& b) { return a.value < b.value; });
  return t;
}

// Expected code for x: the sign bit of x, then the nearest magnitude (saturating at the table's end).
uint32_t expected_e4m3(float x) {
  static const std::vector<Candidate> table = e4m3_table();
  const uint32_t sign = std::signbit(x) ? 0x80u : 0u;
  return sign | nearest(table, std::min<double>(std::fabs(x), 448.0));
}
uint32_t expected_e2m1(float x) {
  static const std::vector<Candidate> table = e2m1_table();
  const uint32_t sign = std::signbit(x) ? 8u : 0u;
  return sign | nearest(table, std::min<double>(std::fabs(x), 6.0));
}

// Samples around every value of a sorted table: the values, the midpoints, and one float ulp either side.
std::vector<float> probe_points(const std::vector<Candidate>& table) {
  std::vector<float> points;
  for (size_t i = 0; i < table.size(); ++i) {
    const float v = static_cast<float>(table[i].value);
    points.push_back(v);
    if (i + 1 < table.size()) {
      const double mid = 0.5 * (table[i].value + table[i + 1].value);
      const float m = static_cast<float>(mid);
      if (static_cast<double>(m) == mid) points.push_back(m);  // exact midpoint (a tie)
      points.push_back(std::nextafter(m, 0.0f));
      points.push_back(std::nextafter(m, INFINITY));
    }
  }
  return points;
}

// ---- FP8 E4M3 -----------------------------------------------------------------------------------------------

TEST(E4M3, EveryCodeDecodesToItsValue) {
  for (int c = 0; c < 256; ++c) {
    const double expected = e4m3_value(static_cast<uint8_t>(c));
    const float got = fmt::e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << "code " << c;
      EXPECT_EQ(std::signbit(got), c >= 0x80) << "code " << c;
    }
  }
  EXPECT_EQ(fmt::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fmt::e4m3_to_float(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(fmt::e4m3_to_float(0x08), 0.015625f);     // 2^-6
}

TEST(E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = fmt::e4m3_to_float(static_cast<uint8_t>(c));
    const uint8_t back = fmt::e4m3_from_float(v);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(fmt::e4m3_to_float(back))) << "NaN code " << c << " re-encoded to " << int(back);
    } else {
      EXPECT_EQ(back, c) << "value " << v;
    }
  }
}

TEST(E4M3, MidpointsTieToEvenBothSigns) {
  const std::vector<Candidate> table = e4m3_table();
  int ties = 0;
  for (float p : probe_points(table)) {
    for (float x : {p, -p}) {
      ASSERT_EQ(fmt::e4m3_from_float(x), expected_e4m3(x)) << "x = " << x;
    }
  }
  // Explicit ties, subnormals included: the even code wins.
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const float mid = static_cast<float>(0.5 * (table[i].value + table[i + 1].value));
    const uint32_t even = (table[i].code & 1u) == 0 ? table[i].code : table[i + 1].code;
    EXPECT_EQ(fmt::e4m3_from_float(mid), even) << "midpoint " << mid;
    EXPECT_EQ(fmt::e4m3_from_float(-mid), even | 0x80u) << "midpoint " << -mid;
    ++ties;
  }
  EXPECT_EQ(ties, 126);
  EXPECT_EQ(fmt::e4m3_from_float(0.5f * 0.001953125f), 0x00);  // 2^-10: between 0 and 2^-9, to 0
  EXPECT_EQ(fmt::e4m3_from_float(1.5f * 0.001953125f), 0x02);  // between codes 1 and 2, to 2
  EXPECT_EQ(fmt::e4m3_from_float(1.0625f), 0x38);              // between 1 and 1.125, to 1
  EXPECT_EQ(fmt::e4m3_from_float(1.1875f), 0x3A);              // between 1.125 and 1.25, to 1.25
}

TEST(E4M3, RandomValuesMatchBruteForce) {
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = std::ldexp(mantissa(rng()), static_cast<int>(std::floor(exponent(rng()))));
    if (i & 1) x = -x;
    ASSERT_EQ(fmt::e4m3_from_float(x), expected_e4m3(x)) << "x = " << x;
  }
}

TEST(E4M3, SaturatesAndKeepsNaN) {
  for (float x : {448.0f, 449.0f, 464.0f, 465.0f, 1000.0f, 1e30f, std::numeric_limits<float>::max(), INFINITY}) {
    EXPECT_EQ(fmt::e4m3_from_float(x), 0x7E) << x;
    EXPECT_EQ(fmt::e4m3_from_float(-x), 0xFE) << -x;
  }
  EXPECT_EQ(fmt::e4m3_to_float(fmt::e4m3_from_float(-INFINITY)), -448.0f);
  for (float nan : {NAN, -NAN, fmt::bits_float(0x7F800001u), fmt::bits_float(0xFFFFFFFFu)})
    EXPECT_TRUE(std::isnan(fmt::e4m3_to_float(fmt::e4m3_from_float(nan))));
  EXPECT_EQ(fmt::e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(fmt::e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(fmt::e4m3_from_float(1e-30f), 0x00);  // underflow to zero keeps the sign
  EXPECT_EQ(fmt::e4m3_from_float(-1e-30f), 0x80);
}

// ---- FP4 E2M1 -----------------------------------------------------------------------------------------------

TEST(E2M1, EveryNibbleDecodesAndRoundTrips) {
  const float expected[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int n = 0; n < 16; ++n) {
    const float v = fmt::e2m1_to_float(static_cast<uint8_t>(n));
    EXPECT_EQ(static_cast<double>(v), e2m1_value(static_cast<uint8_t>(n))) << "nibble " << n;
    EXPECT_EQ(std::fabs(v), expected[n & 7]) << "nibble " << n;
    EXPECT_EQ(fmt::e2m1_from_float(v), n) << "value " << v;
    // Every E2M1 value is exact in E4M3.
    EXPECT_EQ(fmt::e4m3_to_float(fmt::e4m3_from_float(v)), v);
  }
}

TEST(E2M1, MidpointsTieToEvenAndMatchBruteForce) {
  const std::vector<Candidate> table = e2m1_table();
  for (float p : probe_points(table))
    for (float x : {p, -p}) ASSERT_EQ(fmt::e2m1_from_float(x), expected_e2m1(x)) << "x = " << x;
  // The seven ties: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
  const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float to[7] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(fmt::e2m1_to_float(fmt::e2m1_from_float(ties[i])), to[i]) << ties[i];
    EXPECT_EQ(fmt::e2m1_to_float(fmt::e2m1_from_float(-ties[i])), -to[i]) << -ties[i];
  }
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng());
    ASSERT_EQ(fmt::e2m1_from_float(x), expected_e2m1(x)) << "x = " << x;
  }
}

TEST(E2M1, SaturatesAboveSix) {
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, 1e30f, INFINITY}) {
    EXPECT_EQ(fmt::e2m1_from_float(x), 0x7) << x;
    EXPECT_EQ(fmt::e2m1_from_float(-x), 0xF) << -x;
  }
  EXPECT_EQ(fmt::e2m1_from_float(-0.0f), 0x8);
  EXPECT_EQ(fmt::e2m1_from_float(0.0f), 0x0);
}

TEST(E2M1, NibblePackingOrder) {
  // Low nibble = even element (first along K), high nibble = odd.
  EXPECT_EQ(fmt::e2m1_pack(0x1, 0xF), 0xF1);
  for (int byte = 0; byte < 256; ++byte) {
    const uint8_t b = static_cast<uint8_t>(byte);
    EXPECT_EQ(fmt::e2m1_unpack(b, 0), byte & 0xF);
    EXPECT_EQ(fmt::e2m1_unpack(b, 1), byte >> 4);
    EXPECT_EQ(fmt::e2m1_unpack(b, 6), byte & 0xF);  // any even index
    EXPECT_EQ(fmt::e2m1_unpack(b, 7), byte >> 4);
    EXPECT_EQ(fmt::e2m1_pack(fmt::e2m1_unpack(b, 0), fmt::e2m1_unpack(b, 1)), b);
  }
  // A row [1.0, -6.0, 0.5, 3.0] packs to two bytes, first element in the first byte's low nibble.
  const float row[4] = {1.0f, -6.0f, 0.5f, 3.0f};
  const uint8_t b0 = fmt::e2m1_pack(fmt::e2m1_from_float(row[0]), fmt::e2m1_from_float(row[1]));
  const uint8_t b1 = fmt::e2m1_pack(fmt::e2m1_from_float(row[2]), fmt::e2m1_from_float(row[3]));
  EXPECT_EQ(b0, 0xF2);
  EXPECT_EQ(b1, 0x51);
}

// ---- UE8M0 --------------------------------------------------------------------------------------------------

TEST(UE8M0, DecodesEveryByte) {
  for (int e = 0; e < 255; ++e) EXPECT_EQ(static_cast<double>(fmt::ue8m0_to_float(static_cast<uint8_t>(e))), std::ldexp(1.0, e - 127)) << e;
  EXPECT_TRUE(std::isnan(fmt::ue8m0_to_float(255)));
}

TEST(UE8M0, ExactFromPowersOfTwo) {
  for (int k = -126; k <= 127; ++k) {
    const float x = std::ldexp(1.0f, k);
    ASSERT_TRUE(fmt::is_pow2(x)) << x;
    EXPECT_EQ(fmt::ue8m0_from_pow2(x), k + 127);
    EXPECT_EQ(fmt::ue8m0_ceil(x), k + 127);
    EXPECT_EQ(fmt::pow2_ceil(x), x);
  }
  EXPECT_FALSE(fmt::is_pow2(3.0f));
  EXPECT_FALSE(fmt::is_pow2(-2.0f));
  EXPECT_FALSE(fmt::is_pow2(0.0f));
  EXPECT_FALSE(fmt::is_pow2(INFINITY));
}

TEST(UE8M0, CeilMatchesBruteForce) {
  // The smallest 2^(e-127) ≥ x over e in [0, 254].
  auto brute = [](float x) {
    for (int e = 0; e < 255; ++e)
      if (std::ldexp(1.0, e - 127) >= static_cast<double>(x)) return e;
    return 254;
  };
  std::uniform_real_distribution<float> exponent(-129.0f, 127.0f);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mantissa(rng()), static_cast<int>(std::floor(exponent(rng()))));
    if (x == 0.0f) continue;
    ASSERT_EQ(fmt::ue8m0_ceil(x), brute(x)) << "x = " << x;
  }
  for (float x : {1.0f, 1.5f, 3.0f, 0.3f, 448.0f, 1e-4f / 448.0f, std::nextafter(2.0f, 4.0f), std::nextafter(2.0f, 0.0f)})
    EXPECT_EQ(fmt::ue8m0_ceil(x), brute(x)) << x;
  EXPECT_EQ(fmt::ue8m0_ceil(NAN), 255);
  EXPECT_EQ(fmt::pow2_ceil(3.0f), 4.0f);
  EXPECT_EQ(fmt::pow2_ceil(0.3f), 0.5f);
}

TEST(UE8M0, PackedFourPerInt32LittleEndian) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 10000; ++i) {
    const uint8_t b[4] = {uint8_t(byte(rng())), uint8_t(byte(rng())), uint8_t(byte(rng())), uint8_t(byte(rng()))};
    const int32_t packed = fmt::ue8m0_pack(b[0], b[1], b[2], b[3]);
    int32_t from_memory;
    std::memcpy(&from_memory, b, 4);  // byte j of the little-endian word = group 4i + j
    ASSERT_EQ(packed, from_memory);
    for (int j = 0; j < 4; ++j) ASSERT_EQ(fmt::ue8m0_unpack(packed, j), b[j]);
  }
  EXPECT_EQ(fmt::ue8m0_pack(127, 127, 127, 127), 0x7F7F7F7F);
  EXPECT_EQ(fmt::ue8m0_unpack(static_cast<int32_t>(0xFF000000u), 3), 255);
}

// ---- BF16 and F16 -------------------------------------------------------------------------------------------

template <typename Encode, typename Decode, typename Value>
void check_16bit(Encode encode, Decode decode, Value value, uint32_t inf_code, double inf_position,
                 const char* name) {
  // Every code decodes to its value and re-encodes to itself (NaN stays NaN).
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const double expected = value(code);
    const float got = decode(code);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << name << " code " << c;
      ASSERT_TRUE(std::isnan(decode(encode(got)))) << name << " code " << c;
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), expected) << name << " code " << c;
    ASSERT_EQ(encode(got), code) << name << " code " << c;
  }
  // Round to nearest even against the brute-force table: midpoints of every adjacent pair, ±1 float ulp,
  // and random floats over the whole range.
  const std::vector<Candidate> table = ieee16_table(value, inf_code, inf_position);
  auto expected_code = [&](float x) {
    const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
    return sign | nearest_sorted(table, std::fabs(static_cast<double>(x)));
  };
  for (float p : probe_points(table)) {
    if (!std::isfinite(p)) continue;
    for (float x : {p, -p}) ASSERT_EQ(encode(x), expected_code(x)) << name << " x = " << x;
  }
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  for (int i = 0; i < 200000; ++i) {
    const float x = fmt::bits_float(bits(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(encode(x), expected_code(x)) << name << " x = " << x;
  }
  EXPECT_EQ(encode(INFINITY), inf_code);
  EXPECT_EQ(encode(-INFINITY), inf_code | 0x8000u);
  EXPECT_TRUE(std::isnan(decode(encode(NAN))));
}

TEST(BF16, RoundTripsAndRoundsToNearestEven) {
  check_16bit(fmt::bf16_from_float, fmt::bf16_to_float, bf16_value, 0x7F80u, std::ldexp(1.0, 128), "bf16");
  EXPECT_EQ(fmt::bf16_from_float(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie between 1 and 1+2^-7: to 1 (even)
  EXPECT_EQ(fmt::bf16_from_float(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie: to the even 1+2^-6
}

TEST(F16, RoundTripsAndRoundsToNearestEven) {
  check_16bit(fmt::f16_from_float, fmt::f16_to_float, f16_value, 0x7C00u, 65536.0, "f16");
  EXPECT_EQ(fmt::f16_from_float(65504.0f), 0x7BFF);
  EXPECT_EQ(fmt::f16_from_float(65519.0f), 0x7BFF);
  EXPECT_EQ(fmt::f16_from_float(65520.0f), 0x7C00);  // the tie with 2^16 goes to inf (even)
  EXPECT_EQ(fmt::f16_from_float(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(fmt::f16_from_float(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 subnormal ulps: to 2
}

}  // namespace
}  // namespace finegemm
