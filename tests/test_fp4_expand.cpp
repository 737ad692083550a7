// The FP4 decode kernel's E2M1 → E4M3 expansion (src/cuda/kernels/fp4_expand.hpp), run on the host with the same
// byte-permute semantics as prmt.b32: exact for every 16-bit input (four codes) through every fold table row, and
// the fold's bound (d ≤ 8) is tight. The GPU tests (test_cuda_fp4) prove the kernel end to end; these catch a wrong
// expansion without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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

// The decode kernel's per-row fold (fp4_row_fold): a row fits exactly when its valid exponents span at most 8, and
// then every valid group's codes through the table row at its offset, times 2^(e_max - 127), are the codes times
// its own scale 2^(e_j - 127), exactly; groups past `valid` read the plain row.
TEST(Fp4Expand, RowFoldIsExactWhereItFits) {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  int fits = 0, spills = 0;
  for (int it = 0; it < 200000; ++it) {
    const uint64_t r = next();
    // Exponents around a base, spreads 0..12, sometimes at the ends of the UE8M0 range.
    const int base = it % 7 == 0 ? 0 : (it % 7 == 1 ? 243 : 100 + static_cast<int>(r % 40));
    uint32_t word = 0;
    int e[4];
    for (int j = 0; j < 4; ++j) {
      e[j] = base + static_cast<int>((r >> (8 + 4 * j)) % 13);
      word |= static_cast<uint32_t>(e[j]) << (8 * j);
    }
    const int valid = 1 + static_cast<int>((r >> 40) % 4);
    int hi = 0, lo = 255;
    for (int j = 0; j < valid; ++j) hi = std::max(hi, e[j]), lo = std::min(lo, e[j]);
    const Fp4RowFold f = fp4_row_fold(word, valid);
    ASSERT_EQ(f.fits, hi - lo <= 8) << "word 0x" << std::hex << word << " valid " << valid;
    if (!f.fits) {
      ++spills;
      continue;
    }
    ++fits;
    ASSERT_EQ(f.e_max, static_cast<uint32_t>(hi));
    for (int j = 0; j < 4; ++j) {
      const uint32_t off = (f.offsets >> (8 * j)) & 0xFFu;
      ASSERT_EQ(off % 8, 0u);
      const int d = static_cast<int>(off / 8);
      if (j >= valid) {
        ASSERT_EQ(d, 0);
        continue;
      }
      ASSERT_LE(d, 8);
      const uint32_t lo_w = fp4_fold_table_word(d, 0), hi_w = fp4_fold_table_word(d, 1);
      for (uint32_t code = 0; code < 16; ++code) {
        const uint32_t out = e2m1x4_to_e4m3x4(code, lo_w, hi_w) & 0xFFu;
        const double got = std::ldexp(static_cast<double>(fmt::e4m3_to_float(static_cast<uint8_t>(out))), hi - 127);
        const double want = std::ldexp(static_cast<double>(e2m1(code)), e[j] - 127);
        ASSERT_EQ(got, want) << "group " << j << " code " << code;
      }
    }
  }
  EXPECT_GT(fits, 10000);
  EXPECT_GT(spills, 10000);
}

}  // namespace
}  // namespace finegemm::cuda
