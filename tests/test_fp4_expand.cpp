// The FP4 decode kernel's E2M1 → E4M3 expansion (src/cuda/kernels/fp4_expand.hpp), run on the host with the same
// byte-permute semantics as prmt.b32: exact for every 16-bit input (four codes) through every fold table row, and
// the fold's bound (d ≤ 8) is tight. The GPU tests (test_cuda_fp4) prove the kernel end to end; these catch a wrong
// expansion without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/formats.hpp"
#include "cuda/kernels/fp4_expand.hpp"

namespace finegemm::cuda {
namespace {

TEST(ByteSelect, CopiesAndReplicatesSigns) {
  // Bytes of {y, x}: 0x00 0x11 0x22 0x83 | 0x94 0x55 0x66 0xF7 (x low).
  const uint32_t x = 0x83221100u, y = 0xF7665594u;
  EXPECT_EQ(byte_perm(x, y, 0x3210u), x);
  EXPECT_EQ(byte_perm(x, y, 0x7654u), y);
  EXPECT_EQ(byte_perm(x, y, 0x0415u), 0x00941155u);
  // Selector bit 3: the selected byte's sign bit over all 8 bits.
  EXPECT_EQ(byte_perm(x, y, 0xBC89u), 0xFFFF0000u);
}

// E2M1 code → value (sign in bit 3).
float e2m1(uint32_t code) { return fmt::e2m1_to_float(static_cast<uint8_t>(code & 0xFu)); }

TEST(Fp4Expand, EveryFourCodesThroughEveryFoldRow) {
  for (int d = 0; d <= 8; ++d) {
    const uint32_t lo = fp4_fold_table_word(d, 0), hi = fp4_fold_table_word(d, 1);
    int64_t checked = 0, negative = 0;
    for (uint32_t h = 0; h < 65536u; ++h) {
      const uint32_t out = e2m1x4_to_e4m3x4(h, lo, hi);
      for (int i = 0; i < 4; ++i) {
        const uint32_t code = (h >> (4 * i)) & 0xFu;
        const float want = std::ldexp(e2m1(code), -d);
        const float got = fmt::e4m3_to_float(static_cast<uint8_t>(out >> (8 * i)));
        ASSERT_EQ(got, want) << "d=" << d << " h=0x" << std::hex << h << " element " << i;
        // -0 (code 8) must stay a zero; every other negative code keeps its sign.
        if (want < 0.0f) ASSERT_TRUE(std::signbit(got));
        negative += want < 0.0f;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 4 * 65536);
    EXPECT_EQ(negative, 4 * 65536 * 7 / 16);  // codes 9..15 in every position
  }
}

TEST(Fp4Expand, RowZeroIsThePlainTable) {
  EXPECT_EQ(fp4_fold_table_word(0, 0), kE2m1TableLo);
  EXPECT_EQ(fp4_fold_table_word(0, 1), kE2m1TableHi);
}

// Why the fold stops at d = 8: at d = 9 the smallest magnitudes (0.5 · 2^-9, 1.5 · 2^-9) are not E4M3 values.
TEST(Fp4Expand, FoldBoundIsTight) {
  int inexact = 0;
  for (int code = 1; code < 8; ++code) {
    const float want = std::ldexp(e2m1(static_cast<uint32_t>(code)), -9);
    inexact += fmt::e4m3_to_float(fmt::e4m3_from_float(want)) != want;
  }
  EXPECT_EQ(inexact, 2);
}

// The FP4 GEMV's table-free expansion (sm90_fp4_gemv.cuh): every byte value in every byte position, both nibbles,
// gives E4M3 bytes worth exactly the code's value · 2^-6, and byte n of the result depends on byte n of the input only.
TEST(Fp4GemvExpand, EveryByteEveryPositionIsTheValueTimes2PowMinus6) {
  for (int pos = 0; pos < 4; ++pos) {
    for (uint32_t b = 0; b < 256; ++b) {
      for (const uint32_t other : {0x00000000u, 0xFFFFFFFFu, 0x5A3C96E1u}) {
        const uint32_t w = (other & ~(0xFFu << (8 * pos))) | (b << (8 * pos));
        const uint8_t lo = static_cast<uint8_t>(e2m1_lo_to_e4m3_2m6(w) >> (8 * pos));
        const uint8_t hi = static_cast<uint8_t>(e2m1_hi_to_e4m3_2m6(w) >> (8 * pos));
        ASSERT_EQ(fmt::e4m3_to_float(lo), std::ldexp(e2m1(b), -6)) << "byte " << b << " at " << pos;
        ASSERT_EQ(fmt::e4m3_to_float(hi), std::ldexp(e2m1(b >> 4), -6)) << "byte " << b << " at " << pos;
      }
    }
  }
}

// The K permutation the GEMV relies on: a lane's eight codes (one word, k0..k7 low nibble first) expand to a0 = the
// even k, a2 = the odd k; its eight activation bytes x0..x7 permute (prmt 0x6420 / 0x7531) to b0 = the even, b1 = the
// odd. The mma pairs a0[i] with b0[i] and a2[i] with b1[i]: the same dot product as Σ_k w_k · x_k.
TEST(Fp4GemvExpand, ActivationPermuteMatchesTheWeightOrder) {
  uint32_t state = 12345u;
  auto next = [&]() { return state = state * 1664525u + 1013904223u; };
  for (int trial = 0; trial < 2000; ++trial) {
    const uint32_t w = next(), x_lo = next() & 0x7E7E7E7Eu, x_hi = next() & 0x7E7E7E7Eu;  // finite E4M3 bytes
    const uint32_t a0 = e2m1_lo_to_e4m3_2m6(w), a2 = e2m1_hi_to_e4m3_2m6(w);
    const uint32_t b0 = byte_perm(x_lo, x_hi, 0x6420u), b1 = byte_perm(x_lo, x_hi, 0x7531u);
    double want = 0.0, got = 0.0;
    for (int k = 0; k < 8; ++k) {
      const uint32_t code = (w >> (4 * k)) & 0xFu;
      const uint8_t xb = static_cast<uint8_t>((k < 4 ? x_lo : x_hi) >> (8 * (k % 4)));
      want += static_cast<double>(e2m1(code)) * fmt::e4m3_to_float(xb);
    }
    for (int i = 0; i < 4; ++i) {
      got += static_cast<double>(fmt::e4m3_to_float(static_cast<uint8_t>(a0 >> (8 * i)))) *
             fmt::e4m3_to_float(static_cast<uint8_t>(b0 >> (8 * i)));
      got += static_cast<double>(fmt::e4m3_to_float(static_cast<uint8_t>(a2 >> (8 * i)))) *
             fmt::e4m3_to_float(static_cast<uint8_t>(b1 >> (8 * i)));
    }
    ASSERT_EQ(got * 64.0, want) << "trial " << trial;
  }
}

// The GEMV's branch-free UE8M0 decode: the bits of fmt::ue8m0_to_float for all 256 exponents (NaN for 255).
TEST(Fp4GemvExpand, Ue8m0BitsMatchTheFormat) {
  for (uint32_t e = 0; e < 256; ++e) {
    const float want = fmt::ue8m0_to_float(static_cast<uint8_t>(e));
    float got;
    const uint32_t bits = ue8m0_float_bits(e);
    std::memcpy(&got, &bits, sizeof got);
    if (e == 255) EXPECT_TRUE(std::isnan(got));
    else EXPECT_EQ(got, want) << "e=" << e;
  }
}

}  // namespace
}  // namespace finegemm::cuda
