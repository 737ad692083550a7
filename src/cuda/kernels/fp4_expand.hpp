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

// ---- The FP4 decode kernel on K-permuted activations (GemmParams::a_perm_k, FINEGEMM_FP4_DECODE_PERM=1).
// The wgmma's A fragment of a k32 step gives thread t of a quad the columns 4t..4t+3 and 16+4t..19+4t of two rows:
// in the weights' own order those are two 16-bit pairs per row and step (16 LDS.U16 per thread and 128 of K, each
// row's four steps through four tables). The dot product does not care about the order of K as long as both operands
// share it, and the activations are ours to write: the quantization stores each 128 of K permuted so that thread t's
// columns of all four steps are the 32 codes of MX group t, one 16-byte chunk of its row. Physical position
// p = 32t + 8s + j (chunk t, word s, nibble j) is logical column 32s + 4t + (j & 3) + 16·(j >> 2) of the block:
// word s of the chunk feeds step s, its codes 0-3 the low register of the row and codes 4-7 the high one (the order
// e2m1x8_to_e4m3x8 writes them in). One chunk load per row, one table per row (its group's fold) for the block.
FG_HD int fp4_perm_k_logical(int p) {
  return 32 * ((p >> 3) & 3) + 4 * (p >> 5) + (p & 3) + 16 * ((p >> 2) & 1);
}
// The quantizer's side: elements 8v..8v+3 of a block (v = 0..15, the 8-element vector 4t + s) go to byte
// fp4_perm_vector_offset(v) of the block's 128, elements 8v+4..8v+7 to 16 bytes on.
FG_HD int fp4_perm_vector_offset(int v) { return 32 * (v & 3) + 4 * (v >> 2); }

// Chunk t (MX group t) of row r in a stage's packed tile of 64-byte rows, 64-byte swizzled (as TMA wrote it) or not.
FG_HD int fp4_perm_chunk_offset(int r, int t, bool swizzle) {
  return r * 64 + ((t ^ (swizzle ? (r >> 1) & 3 : 0)) << 4);
}

// The A registers of the block's four steps for this thread (a[s]: row r lo, row r + 8 lo, row r hi, row r + 8 hi,
// as the m64k32 fragment orders them) from its chunk of row r (`row_lo`) and of row r + 8 (`row_hi`), each through
// its row's table {x, y} (a fold row, fp4_fold_table_word, or the plain one).
template <typename Chunk>
FG_HD void fp4_perm_fragments(const Chunk& row_lo, const Chunk& row_hi, uint32_t tab_lo_x, uint32_t tab_lo_y,
                              uint32_t tab_hi_x, uint32_t tab_hi_y, uint32_t (&a)[4][4]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int s = 0; s < 4; ++s) {
    e2m1x8_to_e4m3x8(row_lo.w[s], tab_lo_x, tab_lo_y, a[s][0], a[s][2]);
    e2m1x8_to_e4m3x8(row_hi.w[s], tab_hi_x, tab_hi_y, a[s][1], a[s][3]);
  }
}

// A row's four UE8M0 exponents of one 128 of K (byte j: group j): their largest (emax) and group t's distance below
// it (d); true when all four lie within 2^8 of emax, i.e. when every group folds into E4M3 (fp4_fold_table_word).
FG_HD bool fp4_perm_fold(uint32_t word, int t, int& emax, int& d) {
  const int e0 = static_cast<int>(word & 0xFFu), e1 = static_cast<int>((word >> 8) & 0xFFu);
  const int e2 = static_cast<int>((word >> 16) & 0xFFu), e3 = static_cast<int>(word >> 24);
  const int hi01 = e0 > e1 ? e0 : e1, hi23 = e2 > e3 ? e2 : e3;
  const int lo01 = e0 < e1 ? e0 : e1, lo23 = e2 < e3 ? e2 : e3;
  emax = hi01 > hi23 ? hi01 : hi23;
  const int emin = lo01 < lo23 ? lo01 : lo23;
  d = emax - static_cast<int>((word >> (8 * t)) & 0xFFu);
  return emax - emin <= 8;
}

// The prepared fold word of one row and 128 of K (FINEGEMM_FP4_DECODE_FOLD_CACHE: fp4_fold_words_kernel, read by the
// decode kernels' consumers), from the row's stored scale word `raw` (byte j: MX group j's UE8M0 exponent) with
// `valid` of its four groups inside K (1-4; past K a group's codes are zero and its distance 0). `ok`: the valid
// groups lie within 2^8 of their largest, e_max, i.e. the row folds (fp4_decode_prepare_scales' test). The word:
// group j's distance e_max - e_j in bits 4j..4j+3, e_max in bits 16-23 (meaningful where the row folds; a tile with a
// row that does not fold keeps the stored words).
FG_HD uint32_t fp4_fold_word(uint32_t raw, int valid, bool& ok) {
  int hi = 0, lo = 255;
  for (int j = 0; j < 4; ++j) {
    const int e = static_cast<int>((raw >> (8 * j)) & 0xFFu);
    if (j < valid) hi = e > hi ? e : hi, lo = e < lo ? e : lo;
  }
  ok = hi - lo <= 8;
  uint32_t word = static_cast<uint32_t>(hi) << 16;
  for (int j = 0; j < 4; ++j) {
    const int d = hi - static_cast<int>((raw >> (8 * j)) & 0xFFu);
    if (j < valid && d <= 8) word |= static_cast<uint32_t>(d) << (4 * j);
  }
  return word;
}
FG_HD int fp4_fold_word_dist(uint32_t word, int j) { return static_cast<int>((word >> (4 * j)) & 0xFu); }
FG_HD int fp4_fold_word_emax(uint32_t word) { return static_cast<int>((word >> 16) & 0xFFu); }

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
