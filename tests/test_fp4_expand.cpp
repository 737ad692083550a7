// The FP4 decode kernel's E2M1 → E4M3 expansion (src/cuda/kernels/fp4_expand.hpp), run on the host with the same
// byte-permute semantics as prmt.b32: exact for every 16-bit input (four codes) through every fold table row, and
// the fold's bound (d ≤ 8) is tight. The GPU tests (test_cuda_fp4) prove the kernel end to end; these catch a wrong
// expansion without a GPU.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace finegemm::cuda
