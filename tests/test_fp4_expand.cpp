// The FP4 decode kernel's E2M1 → E4M3 expansion (src/cuda/kernels/fp4_expand.hpp), run on the host with the same
// byte-permute semantics as prmt.b32: exact for every 16-bit input (four codes) through every fold table row, and
// the fold's bound (d ≤ 8) is tight. The GPU tests (test_cuda_fp4) prove the kernel end to end; these catch a wrong
// expansion without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

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

// The eight-code expansion of the lean GEMM's in-kernel FP4 path: the same bytes as two four-code expansions, for
// every table row, on words covering every nibble value in every position and random ones.
TEST(Fp4Expand, EightCodesMatchTwoFourCodeExpansions) {
  uint32_t state = 987654321u;
  auto next = [&]() { return state = state * 1664525u + 1013904223u; };
  for (int d = 0; d <= 8; ++d) {
    const uint32_t lo = fp4_fold_table_word(d, 0), hi = fp4_fold_table_word(d, 1);
    for (int trial = 0; trial < 20000; ++trial) {
      // The first 16 trials: nibble value trial in all eight positions.
      const uint32_t w = trial < 16 ? 0x11111111u * static_cast<uint32_t>(trial) : next();
      uint32_t o0 = 0, o1 = 0;
      e2m1x8_to_e4m3x8(w, lo, hi, o0, o1);
      ASSERT_EQ(o0, e2m1x4_to_e4m3x4(w & 0xFFFFu, lo, hi)) << "d=" << d << " w=0x" << std::hex << w;
      ASSERT_EQ(o1, e2m1x4_to_e4m3x4(w >> 16, lo, hi)) << "d=" << d << " w=0x" << std::hex << w;
    }
  }
}

// The kernel reaches the chunks as row term ^ (chunk << 4) from a 1024-aligned base: the same offsets.
TEST(Fp4Expand, LeanChunkOffsetsByRowTermAndXor) {
  for (int base = 0; base < 4 * 16384; base += 8192)
    for (int r = 0; r < 128; ++r) {
      for (int c = 0; c < 4; ++c) ASSERT_EQ((base + lean_fp4_packed_row(r)) ^ (c << 4), base + lean_fp4_packed_chunk(r, c));
      for (int c = 0; c < 8; ++c) ASSERT_EQ((base + lean_fp4_e4m3_row(r)) ^ (c << 4), base + lean_fp4_e4m3_chunk(r, c));
    }
}

// One K block of a 128-row FP4 weight tile as the lean GEMM's producer warpgroup expands it (lean_fp4_expand_group,
// thread r takes row r): packed codes placed as TMA's 64-byte swizzle leaves them, each (row, group) with its own fold
// distance d, and the E4M3 tile read back through the 128-byte swizzle: every element is its code's value · 2^-d,
// every byte of the output tile is written once, and no load reads outside the packed tile.
TEST(Fp4Expand, LeanTileExpansionLandsInTheSwizzledLayout) {
  uint32_t state = 2468u;
  auto next = [&]() { return state = state * 1664525u + 1013904223u; };
  uint32_t tables[9][2];
  for (int d = 0; d <= 8; ++d) tables[d][0] = fp4_fold_table_word(d, 0), tables[d][1] = fp4_fold_table_word(d, 1);
  for (int trial = 0; trial < 4; ++trial) {
    alignas(1024) static uint8_t codes[128][128];  // [row][k] nibbles, the tile as it is in memory (unswizzled)
    alignas(1024) static uint8_t packed[128 * 64];
    alignas(1024) static uint8_t e4m3[128 * 128];
    int dist[128][4];
    for (int r = 0; r < 128; ++r) {
      for (int k = 0; k < 128; ++k) codes[r][k] = static_cast<uint8_t>(next() >> 13) & 0xFu;
      for (int j = 0; j < 4; ++j) dist[r][j] = static_cast<int>((next() >> 9) % 9u);
    }
    // TMA with the 64-byte swizzle: chunk c of row r (packed bytes 16c..16c+15, codes 32c..32c+31) at c ^ (r/2 % 4).
    for (int r = 0; r < 128; ++r)
      for (int c = 0; c < 4; ++c)
        for (int b = 0; b < 16; ++b) {
          const int k = 32 * c + 2 * b;
          packed[r * 64 + 16 * (c ^ ((r >> 1) & 3)) + b] = static_cast<uint8_t>(codes[r][k] | (codes[r][k + 1] << 4));
        }
    std::memset(e4m3, 0xA5, sizeof e4m3);  // poison: a byte left unwritten shows
    std::vector<int> written(sizeof e4m3, 0);
    for (int r = 0; r < 128; ++r)
      for (int j = 0; j < 4; ++j) {
        ASSERT_LE(lean_fp4_packed_chunk(r, j) + 16, static_cast<int>(sizeof packed));
        for (int h = 0; h < 2; ++h) {
          const int off = lean_fp4_e4m3_chunk(r, 2 * j + h);
          ASSERT_LE(off + 16, static_cast<int>(sizeof e4m3));
          for (int b = 0; b < 16; ++b) ++written[off + b];
        }
        lean_fp4_expand_group(packed, e4m3, r, j, tables[dist[r][j]][0], tables[dist[r][j]][1]);
      }
    for (size_t i = 0; i < written.size(); ++i) ASSERT_EQ(written[i], 1) << "byte " << i;
    // Read back as the wgmma sees a 128-byte-swizzled K-major tile: element (r, k) in chunk k / 16 at (k/16) ^ (r % 8).
    for (int r = 0; r < 128; ++r)
      for (int k = 0; k < 128; ++k) {
        const uint8_t got = e4m3[r * 128 + 16 * ((k / 16) ^ (r % 8)) + k % 16];
        const float want = std::ldexp(e2m1(codes[r][k]), -dist[r][k / 32]);
        ASSERT_EQ(fmt::e4m3_to_float(got), want) << "trial " << trial << " row " << r << " k " << k;
        if (want == 0.0f) ASSERT_EQ(got & 0x80u, codes[r][k] & 0x8u ? 0x80u : 0u);  // the sign of -0 kept
      }
  }
}

// The permuted FP4 decode (GemmParams::a_perm_k): one 128 of K of a 64-row weight tile, simulated thread by thread
// as the kernel's consumer warpgroup runs it, against the plain dot product in double (exact at these ranges):
//   - the activations permuted as the quantizer stores them (fp4_perm_vector_offset), which must be the map
//     fp4_perm_k_logical;
//   - each thread's two chunks read from the tile as TMA's 64-byte swizzle (or none) leaves it, its rows' fold decision
//     (fp4_perm_fold), the tables, and its A registers (fp4_perm_fragments) placed where wgmma's m64k32 fragment puts
//     them: register i of lane (g, t) in warp w, byte b: row 16w + g + 8·(i & 1), column 4t + b + 16·(i >> 1);
//   - the fold when every row of the tile folds (one chain, times 2^emax per row), otherwise four passes with only the
//     lanes of group g (t = g) holding codes, each times its group's scale.
// The same registers against the activations in their own order must give another result (the check can fail).
TEST(Fp4PermutedDecode, FragmentsOnPermutedActivationsAreTheDotProduct) {
  uint32_t state = 97531u;
  auto next = [&]() { return state = state * 1664525u + 1013904223u; };
  constexpr int kRows = 64, kK = 128, kTokens = 8;
  int fold_trials = 0, pass_trials = 0;
  for (int trial = 0; trial < 48; ++trial) {
    const bool swizzle = trial % 2 == 0;
    const bool wide = trial % 3 == 2;  // one row spreads past 8: the tile takes the four passes
    uint8_t codes[kRows][kK];
    int exps[kRows][4];
    for (int r = 0; r < kRows; ++r) {
      for (int k = 0; k < kK; ++k) codes[r][k] = static_cast<uint8_t>((next() >> 11) & 0xFu);
      const int base = 110 + static_cast<int>((next() >> 7) % 30u);
      for (int j = 0; j < 4; ++j) exps[r][j] = base + static_cast<int>((next() >> 9) % 9u);
    }
    if (wide) {
      const int r = static_cast<int>((next() >> 5) % kRows);
      exps[r][(next() >> 5) % 4] = *std::max_element(exps[r], exps[r] + 4) + 9 + static_cast<int>((next() >> 5) % 4u);
    }
    // Activations: finite E4M3 within 2^-3..2^3·1.875 (exponent fields 4..10), random signs.
    uint8_t x[kTokens][kK], x_perm[kTokens][kK];
    for (int m = 0; m < kTokens; ++m)
      for (int k = 0; k < kK; ++k) {
        const uint32_t v = next();
        x[m][k] = static_cast<uint8_t>(((v >> 3) & 0x80u) | ((4u + (v >> 9) % 7u) << 3) | ((v >> 20) & 7u));
      }
    // The quantizer's stores: vector v's elements 0-3 at fp4_perm_vector_offset(v), 4-7 16 bytes on.
    std::memset(x_perm, 0xA5, sizeof x_perm);
    for (int m = 0; m < kTokens; ++m)
      for (int v = 0; v < 16; ++v)
        for (int e = 0; e < 8; ++e) x_perm[m][fp4_perm_vector_offset(v) + (e < 4 ? e : 12 + e)] = x[m][8 * v + e];
    for (int m = 0; m < kTokens; ++m)
      for (int p = 0; p < kK; ++p) ASSERT_EQ(x_perm[m][fp4_perm_k_logical(p)], x[m][p]) << "position " << p;
    // The packed tile as TMA leaves it: chunk c of row r (codes 32c..32c+31) at chunk c ^ (r/2 % 4) when swizzled.
    uint8_t tile[kRows * 64];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < 4; ++c)
        for (int b = 0; b < 16; ++b)
          tile[r * 64 + 16 * (c ^ (swizzle ? (r >> 1) & 3 : 0)) + b] =
              static_cast<uint8_t>(codes[r][32 * c + 2 * b] | (codes[r][32 * c + 2 * b + 1] << 4));
    // Every thread: its chunks and fold decision; the tile folds when every thread's rows do.
    struct Chunk {
      uint32_t w[4];
    };
    Chunk chunk[4][32][2];
    int emax[4][32][2], dist[4][32][2];
    bool fold = true;
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane)
        for (int h = 0; h < 2; ++h) {
          const int r = 16 * warp + (lane >> 2) + 8 * h, t = lane & 3;
          std::memcpy(chunk[warp][lane][h].w, tile + fp4_perm_chunk_offset(r, t, swizzle), 16);
          const uint32_t word = static_cast<uint32_t>(exps[r][0]) | static_cast<uint32_t>(exps[r][1]) << 8 |
                                static_cast<uint32_t>(exps[r][2]) << 16 | static_cast<uint32_t>(exps[r][3]) << 24;
          fold = fp4_perm_fold(word, t, emax[warp][lane][h], dist[warp][lane][h]) && fold;
          ASSERT_EQ(emax[warp][lane][h], *std::max_element(exps[r], exps[r] + 4));
          ASSERT_EQ(dist[warp][lane][h], emax[warp][lane][h] - exps[r][t]);
        }
    ASSERT_EQ(fold, !wide) << "trial " << trial;
    (fold ? fold_trials : pass_trials) += 1;
    // One pass of the wgmma over the tile: registers of the lanes `keep` accepts, the rest zero; D[row][token].
    auto pass = [&](bool use_fold, auto keep, const uint8_t (&act)[kTokens][kK], double (&d)[kRows][kTokens]) {
      uint8_t a[kRows][kK];  // logical A: [row][32s + column]
      std::memset(a, 0, sizeof a);
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane) {
          const int t = lane & 3;
          if (!keep(t)) continue;
          const int d0 = use_fold ? dist[warp][lane][0] : 0, d1 = use_fold ? dist[warp][lane][1] : 0;
          uint32_t regs[4][4];
          fp4_perm_fragments(chunk[warp][lane][0], chunk[warp][lane][1], fp4_fold_table_word(d0, 0),
                             fp4_fold_table_word(d0, 1), fp4_fold_table_word(d1, 0), fp4_fold_table_word(d1, 1), regs);
          for (int s = 0; s < 4; ++s)
            for (int i = 0; i < 4; ++i)
              for (int b = 0; b < 4; ++b)
                a[16 * warp + (lane >> 2) + 8 * (i & 1)][32 * s + 4 * t + b + 16 * (i >> 1)] =
                    static_cast<uint8_t>(regs[s][i] >> (8 * b));
        }
      for (int r = 0; r < kRows; ++r)
        for (int m = 0; m < kTokens; ++m) {
          double sum = 0.0;
          for (int k = 0; k < kK; ++k)
            sum += static_cast<double>(fmt::e4m3_to_float(a[r][k])) * fmt::e4m3_to_float(act[m][k]);
          d[r][m] = sum;
        }
    };
    auto run = [&](const uint8_t (&act)[kTokens][kK], double (&y)[kRows][kTokens]) {
      static double d[kRows][kTokens];
      if (fold) {
        pass(true, [](int) { return true; }, act, d);
        for (int r = 0; r < kRows; ++r)
          for (int m = 0; m < kTokens; ++m)
            y[r][m] = d[r][m] * std::ldexp(1.0, *std::max_element(exps[r], exps[r] + 4) - 127);
      } else {
        for (int r = 0; r < kRows; ++r)
          for (int m = 0; m < kTokens; ++m) y[r][m] = 0.0;
        for (int g = 0; g < 4; ++g) {
          pass(false, [g](int t) { return t == g; }, act, d);
          for (int r = 0; r < kRows; ++r)
            for (int m = 0; m < kTokens; ++m) y[r][m] += d[r][m] * std::ldexp(1.0, exps[r][g] - 127);
        }
      }
    };
    double got[kRows][kTokens], unpermuted[kRows][kTokens];
    run(x_perm, got);
    run(x, unpermuted);
    int differ = 0;
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < kTokens; ++m) {
        double want = 0.0;
        for (int k = 0; k < kK; ++k)
          want += static_cast<double>(e2m1(codes[r][k])) * std::ldexp(1.0, exps[r][k / 32] - 127) *
                  fmt::e4m3_to_float(x[m][k]);
        ASSERT_EQ(got[r][m], want) << "trial " << trial << " row " << r << " token " << m;
        differ += unpermuted[r][m] != want;
      }
    EXPECT_GT(differ, kRows * kTokens / 2) << "trial " << trial << ": the permutation made no difference";
  }
  EXPECT_EQ(fold_trials, 32);
  EXPECT_EQ(pass_trials, 16);
}

// The prepared fold words (fp4_fold_word, made by fp4_fold_words_kernel and read by the decode consumers): for
// every spread 0..12 of 1-4 valid groups (exponents near 0, mid-range and near 255, in every order), the word's test,
// distances and e_max are those of the preparer warp (fp4_decode_prepare_scales: the valid groups' largest, each
// valid group's distance below it, 0 past K, folding where the spread is at most 8) and, with four valid groups, of
// the permuted kernel's own fold (fp4_perm_fold) for every thread t of a quad.
TEST(Fp4FoldWords, MatchThePreparerAndThePermutedFold) {
  std::mt19937 rng(46);
  int folds = 0, wide = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int valid = 1 + trial % 4;
    const int spread = (trial / 4) % 13;
    const int base = trial % 3 == 0 ? 0 : (trial % 3 == 1 ? 120 : 255 - spread);
    int e[4];
    for (int j = 0; j < 4; ++j) e[j] = base + static_cast<int>(rng() % (spread + 1));
    e[rng() % 4] = base;                         // the spread reached (for a valid group once shuffled below)
    e[rng() % 4] = base + spread;
    std::shuffle(e, e + 4, rng);
    uint32_t raw = 0;
    for (int j = 0; j < 4; ++j) raw |= static_cast<uint32_t>(e[j]) << (8 * j);
    int hi = 0, lo = 255;
    for (int j = 0; j < valid; ++j) hi = std::max(hi, e[j]), lo = std::min(lo, e[j]);
    bool ok = false;
    const uint32_t word = fp4_fold_word(raw, valid, ok);
    ASSERT_EQ(ok, hi - lo <= 8) << "trial " << trial;
    (ok ? folds : wide) += 1;
    if (!ok) continue;  // a tile with such a row keeps its stored scale words
    ASSERT_EQ(fp4_fold_word_emax(word), hi);
    for (int j = 0; j < 4; ++j) ASSERT_EQ(fp4_fold_word_dist(word, j), j < valid ? hi - e[j] : 0) << "group " << j;
    if (valid == 4) {
      for (int t = 0; t < 4; ++t) {
        int emax = -1, dist = -1;
        ASSERT_TRUE(fp4_perm_fold(raw, t, emax, dist));
        ASSERT_EQ(fp4_fold_word_emax(word), emax);
        ASSERT_EQ(fp4_fold_word_dist(word, t), dist);
      }
    }
  }
  EXPECT_GT(folds, 1000) << "self-check: rows that fold";
  EXPECT_GT(wide, 1000) << "self-check: rows that do not";
}

}  // namespace
}  // namespace finegemm::cuda
