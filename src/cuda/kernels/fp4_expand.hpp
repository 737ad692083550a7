// E2M1 → E4M3 expansion by byte permutes, as the FP4 decode kernel's consumers run it (sm90_fp4_decode.cuh), in
// host/device code so that the CPU tests prove it exact on every input (tests/test_fp4_expand.cpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "core/formats.hpp"

namespace finegemm::cuda {

// prmt.b32 in its default mode: byte n of the result is byte (s >> 4n) & 7 of {y, x} (x the low four), or, when bit
// (4n + 3) of s is set, that byte's sign bit replicated over 8 bits.
FG_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(s));
  return r;
#else
  const uint64_t src = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 0xFu;
    uint32_t b = static_cast<uint32_t>(src >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) b = (b & 0x80u) ? 0xFFu : 0x00u;
    r |= b << (8 * n);
  }
  return r;
#endif
}

// The E2M1 magnitudes (codes 0-7) as E4M3 bytes, four per word: 0, 0.5, 1, 1.5 | 2, 3, 4, 6.
inline constexpr uint32_t kE2m1TableLo = 0x3C383000u;
inline constexpr uint32_t kE2m1TableHi = 0x4C484440u;

// Four E2M1 codes (16 bits, element 0 in the low nibble) → four E4M3 bytes (element 0 in the low byte), through the
// 8-entry magnitude table {tab_lo, tab_hi} (kE2m1Table*, or a fold row, fp4_fold_table_word). Exact.
// Magnitudes: one permute selected by the codes without their signs. Signs: code i's sign bit is bit 4i + 3 of h;
// codes 1 and 3 have theirs at bit 7 of h's bytes 0 and 1 already, codes 0 and 2 at bit 7 of (h << 4)'s: one
// permute of h << 4 and h puts each at bit 7 of its output byte. Five instructions per four codes. (A
// sign-replicating permute cannot do it in four: replicating a byte's top bit leaves bit 7 as it was.)
FG_HD uint32_t e2m1x4_to_e4m3x4(uint32_t h, uint32_t tab_lo, uint32_t tab_hi) {
  const uint32_t mag = byte_perm(tab_lo, tab_hi, h & 0x7777u);
  const uint32_t sign = byte_perm(h << 4, h, 0x5140u);  // bytes: (h << 4).0, h.0, (h << 4).1, h.1
  return mag | (sign & 0x80808080u);
}

// Word `half` (0: codes 0-3, 1: codes 4-7) of fold table row d: the E2M1 magnitudes times 2^-d as E4M3 bytes,
// d = 0..8 (exact: 0.5 · 2^-8 = 2^-9 is E4M3's smallest subnormal; d = 9 loses 0.5 and 1.5). Row 0 is the plain
// table. A group whose scale is 2^-d of its 128-wide block's largest expands through row d.
FG_HD uint32_t fp4_fold_table_word(int d, int half) {
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint32_t w = 0u;
  for (int j = 0; j < 4; ++j)
    w |= static_cast<uint32_t>(fmt::e4m3_from_float(ldexpf(mags[4 * half + j], -d))) << (8 * j);
  return w;
}


// The FP4 GEMV's table-free expansion (sm90_fp4_gemv.cuh): E2M1 (s e1 e0 m) placed at E4M3 bits 7 and 4..2 is exactly
// the code's value · 2^-6 (exponent e, mantissa m · 4; e = 0 lands on E4M3's subnormals, m · 2^-7). Of a word of four
// packed bytes (two codes each, low nibble first): the low nibbles (even K) as four E4M3 bytes, and the high nibbles
// (odd K). Byte n of the result comes from byte n of w only.
FG_HD uint32_t e2m1_lo_to_e4m3_2m6(uint32_t w) { return ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu); }
FG_HD uint32_t e2m1_hi_to_e4m3_2m6(uint32_t w) { return (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu); }

// fmt::ue8m0_to_float's bits without branches: 2^(e - 127); e = 0 the subnormal 2^-127, e = 255 NaN.
FG_HD uint32_t ue8m0_float_bits(uint32_t e) {
  const uint32_t shifted = e << 23;
  return (shifted > 0x00400000u ? shifted : 0x00400000u) | (e == 255u ? 0x00400000u : 0u);
}

// Eight codes (a packed word: bytes 0-3, low nibble first) → eight E4M3 bytes through one table row {tab_lo, tab_hi}:
// o0 codes 0-3, o1 codes 4-7 (the order of the codes in K). The same operations as e2m1x4_to_e4m3x4 on each half,
// sharing the sign-bit mask and w << 4: prmt reads only its selector's low 16 bits, and the sign permute of the high
// half takes bytes 2 and 3 of the same two words. Nine instructions for eight codes, against eleven for two calls of
// e2m1x4_to_e4m3x4 (the shift of w for the second).
FG_HD void e2m1x8_to_e4m3x8(uint32_t w, uint32_t tab_lo, uint32_t tab_hi, uint32_t& o0, uint32_t& o1) {
  const uint32_t sel = w & 0x77777777u;
  const uint32_t w4 = w << 4;
  o0 = byte_perm(tab_lo, tab_hi, sel) | (byte_perm(w4, w, 0x5140u) & 0x80808080u);
  o1 = byte_perm(tab_lo, tab_hi, sel >> 16) | (byte_perm(w4, w, 0x7362u) & 0x80808080u);
}

// ---- The lean GEMM's in-kernel FP4 expansion (sm90_fp8_gemm_lean.cuh, kFp4B).
// A K block (128 of K) of a 128-row weight tile arrives packed, 64 bytes a row, by TMA with the 64-byte swizzle: the
// 16-byte chunk c (MX group c, 32 codes) of row r at c ^ ((r >> 1) & 3). It goes out as E4M3, 128 bytes a row, in the
// 128-byte swizzle of a TMA-loaded E4M3 tile, which the wgmma descriptors read: chunk c (codes 16c..16c+15) of row r
// at c ^ (r & 7). Byte offsets within the stage's tile:
FG_HD int lean_fp4_packed_chunk(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }
FG_HD int lean_fp4_e4m3_chunk(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }
// The same offsets as a row's term and the chunk's: chunk c of row r at row_term ^ (c << 4) (the row's bits 4-6 hold
// its swizzle pattern and the rest no bit that c << 4 touches), so that a kernel adds the row's term to a 1024-aligned
// stage base once and reaches each chunk with one XOR.
FG_HD int lean_fp4_packed_row(int r) { return r * 64 + (((r >> 1) & 3) << 4); }
FG_HD int lean_fp4_e4m3_row(int r) { return r * 128 + ((r & 7) << 4); }

struct alignas(16) Chunk16 {
  uint32_t w[4];
};

// MX group j of row r (packed chunk j) through the table row {tab_lo, tab_hi} into E4M3 chunks 2j and 2j + 1: one
// 16-byte load and two 16-byte stores. Without bank conflicts when a warp's lanes take consecutive rows: eight rows
// in a row put their chunks in eight different 16-byte bank groups under either swizzle.
FG_HD void lean_fp4_expand_group(const uint8_t* packed, uint8_t* e4m3, int r, int j, uint32_t tab_lo, uint32_t tab_hi) {
  const Chunk16 in = *reinterpret_cast<const Chunk16*>(packed + lean_fp4_packed_chunk(r, j));
  Chunk16 lo, hi;
  e2m1x8_to_e4m3x8(in.w[0], tab_lo, tab_hi, lo.w[0], lo.w[1]);
  e2m1x8_to_e4m3x8(in.w[1], tab_lo, tab_hi, lo.w[2], lo.w[3]);
  e2m1x8_to_e4m3x8(in.w[2], tab_lo, tab_hi, hi.w[0], hi.w[1]);
  e2m1x8_to_e4m3x8(in.w[3], tab_lo, tab_hi, hi.w[2], hi.w[3]);
  *reinterpret_cast<Chunk16*>(e4m3 + lean_fp4_e4m3_chunk(r, 2 * j)) = lo;
  *reinterpret_cast<Chunk16*>(e4m3 + lean_fp4_e4m3_chunk(r, 2 * j + 1)) = hi;
}

}  // namespace finegemm::cuda
