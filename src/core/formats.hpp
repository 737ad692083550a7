// Element and scale formats: FP8 E4M3, FP4 E2M1, UE8M0, BF16, F16.
// Header-only and usable from host and device code. Encoders round to nearest even and saturate.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FG_HD __host__ __device__ __forceinline__
#else
#define FG_HD inline
#endif

namespace finegemm::fmt {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;

FG_HD uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
FG_HD float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
FG_HD bool is_nan(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// ---- FP8 E4M3 (float8_e4m3fn): s1 e4 m3, bias 7, no inf, NaN = 0x7F / 0xFF, max 448.
FG_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_float(sign | 0x7FC00000u);
  if (exp == 0) {
    // Subnormal: man · 2^-9, exact in float.
    float mag = static_cast<float>(man) * 0.001953125f;
    return bits_float(float_bits(mag) | sign);
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

FG_HD uint8_t e4m3_from_float(float x) {
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if (is_nan(x)) return sign | 0x7F;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const float a = bits_float(abs_bits);
  if (a >= kE4M3Max) return sign | 0x7E;  // saturate, inf included
  if (a < 0.015625f) {                     // below 2^-6: subnormal grid k·2^-9
    // a·512 is exact; round half to even by hand (independent of the FP rounding mode).
    const float m = a * 512.0f;
    uint32_t k = static_cast<uint32_t>(m);
    const float frac = m - static_cast<float>(k);
    if (frac > 0.5f || (frac == 0.5f && (k & 1u))) ++k;
    return sign | static_cast<uint8_t>(k);  // k == 8 is 0x08, the smallest normal: still right
  }
  int exp = static_cast<int>(abs_bits >> 23) - 127;  // -6..8
  uint32_t man = abs_bits & 0x7FFFFFu;
  uint32_t q = man >> 20;
  const uint32_t rem = man & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ++q;
  if (q == 8) {
    q = 0;
    ++exp;
  }
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | q);
}

// ---- FP4 E2M1: {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign. No NaN/inf: NaN encodes as ±6 (the
// scale of a NaN group is NaN anyway, so the dequantized value stays NaN).
FG_HD float e2m1_to_float(uint8_t nibble) {
  constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kValues[nibble & 7u];
  return (nibble & 8u) ? -mag : mag;
}

FG_HD uint8_t e2m1_from_float(float x) {
  const uint8_t sign = (float_bits(x) >> 31) ? 8 : 0;
  const float a = bits_float(float_bits(x) & 0x7FFFFFFFu);
  uint8_t code;
  // Ties go to the even code: 0.25→0, 0.75→1.0, 1.25→1.0, 1.75→2, 2.5→2, 3.5→4, 5→4.
  if (is_nan(x)) code = 7;
  else if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

// Packed FP4: element 2i in the low nibble, 2i+1 in the high nibble.
FG_HD uint8_t e2m1_pack(uint8_t even, uint8_t odd) { return static_cast<uint8_t>((even & 0xFu) | ((odd & 0xFu) << 4)); }
FG_HD uint8_t e2m1_unpack(uint8_t byte, int index) { return (index & 1) ? (byte >> 4) : (byte & 0xFu); }

// ---- UE8M0: 2^(e-127), e = 255 is NaN.
FG_HD float ue8m0_to_float(uint8_t e) {
  if (e == 255) return bits_float(0x7FC00000u);
  if (e == 0) return bits_float(0x00400000u);  // 2^-127, a float subnormal
  return bits_float(static_cast<uint32_t>(e) << 23);
}
FG_HD bool is_pow2(float x) {
  const uint32_t b = float_bits(x);
  return !(b >> 31) && ((b >> 23) & 0xFFu) != 0 && ((b >> 23) & 0xFFu) != 0xFFu && (b & 0x7FFFFFu) == 0;
}
// Exact: x must be a positive normal power of two (callers check is_pow2 first).
FG_HD uint8_t ue8m0_from_pow2(float x) { return static_cast<uint8_t>((float_bits(x) >> 23) & 0xFFu); }
// The smallest 2^k ≥ x, for x > 0. Values at or below 2^-127 give 2^-127; NaN gives NaN (255).
FG_HD uint8_t ue8m0_ceil(float x) {
  if (is_nan(x)) return 255;
  const uint32_t b = float_bits(x) & 0x7FFFFFFFu;
  if (b <= 0x00400000u) return 0;
  uint32_t e = b >> 23;
  if (e == 0) return 1;  // subnormal above 2^-127: 2^-126
  if (e >= 0xFFu) return 254;
  if (b & 0x7FFFFFu) ++e;
  return static_cast<uint8_t>(e > 254 ? 254 : e);
}
FG_HD float pow2_ceil(float x) { return ue8m0_to_float(ue8m0_ceil(x)); }

// Packed UE8M0: four consecutive K-scales per int32, byte j = group 4i + j.
FG_HD uint8_t ue8m0_unpack(int32_t packed, int j) { return static_cast<uint8_t>((static_cast<uint32_t>(packed) >> (8 * j)) & 0xFFu); }
FG_HD int32_t ue8m0_pack(uint8_t b0, uint8_t b1, uint8_t b2, uint8_t b3) {
  return static_cast<int32_t>(uint32_t(b0) | (uint32_t(b1) << 8) | (uint32_t(b2) << 16) | (uint32_t(b3) << 24));
}

// ---- BF16 and F16 (storage as uint16_t).
FG_HD float bf16_to_float(uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); }
FG_HD uint16_t bf16_from_float(float x) {
  uint32_t b = float_bits(x);
  if (is_nan(x)) return static_cast<uint16_t>((b >> 16) | 0x40u);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

FG_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    float mag = static_cast<float>(man) * 5.9604644775390625e-8f;  // man · 2^-24
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}
FG_HD uint16_t f16_from_float(float x) {
  const uint32_t b = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t abs_bits = b & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7E00u;
  if (abs_bits >= 0x477FF000u) return sign | 0x7C00u;  // ≥ 65520 rounds to inf
  int exp = static_cast<int>(abs_bits >> 23) - 127;
  if (exp < -14) {
    // Subnormal half: k·2^-24, round half to even.
    const float m = bits_float(abs_bits) * 16777216.0f;
    uint32_t k = static_cast<uint32_t>(m);
    const float frac = m - static_cast<float>(k);
    if (frac > 0.5f || (frac == 0.5f && (k & 1u))) ++k;
    return sign | static_cast<uint16_t>(k);
  }
  uint32_t man = abs_bits & 0x7FFFFFu;
  uint32_t q = man >> 13;
  const uint32_t rem = man & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;
  uint32_t e = static_cast<uint32_t>(exp + 15);
  if (q == 0x400u) {
    q = 0;
    ++e;
  }
  return sign | static_cast<uint16_t>((e << 10) | q);
}

}  // namespace finegemm::fmt
