// Register-tile products of the train step's attention kernel (attention_train.cc): c = a b for
// four rows of a at a time against b packed into column panels: 16 columns with AVX2 + FMA
// (``Rows4``), 32 with AVX-512 (``Rows4Wide``; twice the columns per instruction). Both sum each
// output's products over k in order with one FMA each, so they give the same bits.
#ifndef T5LIKE_KERNELS_TILE_H_
#define T5LIKE_KERNELS_TILE_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"

#ifdef T5LIKE_X86
namespace t5like::tile {

constexpr int64_t kPanel = 16;      // Columns of b per packed panel (AVX2).
constexpr int64_t kWidePanel = 32;  // Columns of b per packed panel (AVX-512).

// Whether this CPU runs the AVX-512 tiles; T5LIKE_KERNELS_ISA=avx2 in the environment keeps the
// AVX2 ones (tests compare the two). Read once.
inline bool Wide() {
  static const bool wide = [] {
    const char* isa = std::getenv("T5LIKE_KERNELS_ISA");
    return __builtin_cpu_supports("avx512f") && !(isa != nullptr && std::strcmp(isa, "avx2") == 0);
  }();
  return wide;
}

// x[0..8) x[ld..ld+8) ... (eight rows of 8) stored transposed into out, rows ldo apart.
__attribute__((target("avx2,fma"), always_inline)) inline void Transpose8(
    const float* x, int64_t ld, float* out, int64_t ldo) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  // r[0..3]: columns 0, 2, 1, 3 of rows 0-3 (lanes 0-3) and 4-7 of them (lanes 4-7) likewise.
  const int order[4] = {0, 2, 1, 3};
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(out + c * ldo, _mm256_permute2f128_ps(r[order[c]], r[4 + order[c]], 0x20));
    _mm256_storeu_ps(out + (c + 4) * ldo,
                     _mm256_permute2f128_ps(r[order[c]], r[4 + order[c]], 0x31));
  }
}

// b [k_len, n_len] (element (k, n) at x[k * k_stride + n * n_stride]) packed as panels of
// ``width`` columns (``PanelWidth()``: the width the tiles this CPU runs read), each
// [k_len, width] contiguous (the last one narrower when n_len is not a multiple), so the
// products below read b sequentially. Either stride is 1: rows (n_stride 1) are copied, columns
// (k_stride 1, a transpose) go through 8 x 8 register transposes; k_len and n_len are multiples
// of 8.
inline __attribute__((target("avx2,fma"))) void Pack(const float* x, int64_t k_len, int64_t n_len,
                                              int64_t k_stride, int64_t n_stride, float* out,
                                              int64_t width) {
  for (int64_t n0 = 0; n0 < n_len; n0 += width) {
    const int64_t w = std::min(width, n_len - n0);
    float* panel = out + n0 * k_len;
    if (n_stride == 1) {
      for (int64_t k = 0; k < k_len; ++k)
        for (int64_t n = 0; n < w; n += 8)
          _mm256_storeu_ps(panel + k * w + n, _mm256_loadu_ps(x + k * k_stride + n0 + n));
    } else {  // k_stride == 1
      for (int64_t n = 0; n < w; n += 8)
        for (int64_t k = 0; k < k_len; k += 8)
          Transpose8(x + (n0 + n) * n_stride + k, n_stride, panel + k * w + n, w);
    }
  }
}

// Element (i, k) of a: row-major with row stride lda, or stored transposed (kTransA: a[k][i]).
template <bool kTransA>
inline const float* At(const float* a, int64_t lda, int64_t i, int64_t k) {
  return kTransA ? a + k * lda + i : a + i * lda + k;
}

// ``Rows4`` for the 8 columns at n (a multiple of 8) alone: where n_lo or n_hi cut a panel,
// and the last panel when n_len % 16 == 8.
template <bool kTransA>
__attribute__((target("avx2,fma"))) void Half4(const float* a, int64_t lda, const float* b,
                                               int64_t k_len, int64_t n_len, float* c,
                                               int64_t ldc, int64_t k_lo, int64_t k_hi,
                                               int64_t n) {
  const int64_t n0 = n / kPanel * kPanel, w = std::min(kPanel, n_len - n0);
  const float* col = b + n0 * k_len + (n - n0);
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t k = k_lo; k < k_hi; ++k) {
    const __m256 b0 = _mm256_loadu_ps(col + k * w);
    c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(At<kTransA>(a, lda, 0, k)), b0, c0);
    c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(At<kTransA>(a, lda, 1, k)), b0, c1);
    c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(At<kTransA>(a, lda, 2, k)), b0, c2);
    c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(At<kTransA>(a, lda, 3, k)), b0, c3);
  }
  _mm256_storeu_ps(c + n, c0);
  _mm256_storeu_ps(c + ldc + n, c1);
  _mm256_storeu_ps(c + 2 * ldc + n, c2);
  _mm256_storeu_ps(c + 3 * ldc + n, c3);
}

// c[i, n] = sum over k in [k_lo, k_hi) of a[i, k] b[k, n] for four rows i of a (``At``) and
// the columns n in [n_lo, n_hi) (multiples of 8) of b, packed by ``Pack`` from [k_len, n_len],
// into c (row stride ldc). An empty k range writes zeros. Four rows by 16 columns keep 8
// accumulators in registers; per k: two loads of b, four broadcasts of a, eight FMAs.
template <bool kTransA>
__attribute__((target("avx2,fma"))) void Rows4(const float* a, int64_t lda, const float* b,
                                               int64_t k_len, int64_t n_len, float* c,
                                               int64_t ldc, int64_t k_lo, int64_t k_hi,
                                               int64_t n_lo, int64_t n_hi) {
  int64_t n = n_lo;
  if (n % kPanel != 0 && n < n_hi) {
    Half4<kTransA>(a, lda, b, k_len, n_len, c, ldc, k_lo, k_hi, n);
    n += 8;
  }
  const int64_t full_end = std::min(n_hi, n_len / kPanel * kPanel);
  for (; n + kPanel <= full_end; n += kPanel) {
    const float* panel = b + n * k_len;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
           c7 = c0;
    for (int64_t k = k_lo; k < k_hi; ++k) {
      const __m256 b0 = _mm256_loadu_ps(panel + k * kPanel);
      const __m256 b1 = _mm256_loadu_ps(panel + k * kPanel + 8);
      __m256 a_i = _mm256_broadcast_ss(At<kTransA>(a, lda, 0, k));
      c0 = _mm256_fmadd_ps(a_i, b0, c0);
      c1 = _mm256_fmadd_ps(a_i, b1, c1);
      a_i = _mm256_broadcast_ss(At<kTransA>(a, lda, 1, k));
      c2 = _mm256_fmadd_ps(a_i, b0, c2);
      c3 = _mm256_fmadd_ps(a_i, b1, c3);
      a_i = _mm256_broadcast_ss(At<kTransA>(a, lda, 2, k));
      c4 = _mm256_fmadd_ps(a_i, b0, c4);
      c5 = _mm256_fmadd_ps(a_i, b1, c5);
      a_i = _mm256_broadcast_ss(At<kTransA>(a, lda, 3, k));
      c6 = _mm256_fmadd_ps(a_i, b0, c6);
      c7 = _mm256_fmadd_ps(a_i, b1, c7);
    }
    _mm256_storeu_ps(c + n, c0);
    _mm256_storeu_ps(c + n + 8, c1);
    _mm256_storeu_ps(c + ldc + n, c2);
    _mm256_storeu_ps(c + ldc + n + 8, c3);
    _mm256_storeu_ps(c + 2 * ldc + n, c4);
    _mm256_storeu_ps(c + 2 * ldc + n + 8, c5);
    _mm256_storeu_ps(c + 3 * ldc + n, c6);
    _mm256_storeu_ps(c + 3 * ldc + n + 8, c7);
  }
  for (; n < n_hi; n += 8) Half4<kTransA>(a, lda, b, k_len, n_len, c, ldc, k_lo, k_hi, n);
}

// Lanes [from, to) of a 16-float register (clipped to 0..16) as a mask.
inline __mmask16 Lanes(int64_t from, int64_t to) {
  from = std::clamp<int64_t>(from, 0, 16);
  to = std::clamp<int64_t>(to, 0, 16);
  return from >= to ? 0 : static_cast<__mmask16>(((1u << to) - 1) & ~((1u << from) - 1));
}

// One 4 x 32 tile of ``Rows4Wide``: b's loads masked (``kMasked``) only in a narrower last panel.
template <bool kTransA, bool kMasked>
__attribute__((target("avx512f,avx2,fma"), always_inline)) inline void Tile4x32(
    const float* a, int64_t lda, const float* panel, int64_t w, float* c, int64_t ldc,
    int64_t k_lo, int64_t k_hi, __mmask16 l0, __mmask16 l1, __mmask16 s0, __mmask16 s1) {
  __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0, x4 = x0, x5 = x0, x6 = x0, x7 = x0;
  for (int64_t k = k_lo; k < k_hi; ++k) {
    const float* row = panel + k * w;
    const __m512 b0 = kMasked ? _mm512_maskz_loadu_ps(l0, row) : _mm512_loadu_ps(row);
    const __m512 b1 = kMasked ? _mm512_maskz_loadu_ps(l1, row + 16) : _mm512_loadu_ps(row + 16);
    __m512 a_i = _mm512_set1_ps(*At<kTransA>(a, lda, 0, k));
    x0 = _mm512_fmadd_ps(a_i, b0, x0);
    x1 = _mm512_fmadd_ps(a_i, b1, x1);
    a_i = _mm512_set1_ps(*At<kTransA>(a, lda, 1, k));
    x2 = _mm512_fmadd_ps(a_i, b0, x2);
    x3 = _mm512_fmadd_ps(a_i, b1, x3);
    a_i = _mm512_set1_ps(*At<kTransA>(a, lda, 2, k));
    x4 = _mm512_fmadd_ps(a_i, b0, x4);
    x5 = _mm512_fmadd_ps(a_i, b1, x5);
    a_i = _mm512_set1_ps(*At<kTransA>(a, lda, 3, k));
    x6 = _mm512_fmadd_ps(a_i, b0, x6);
    x7 = _mm512_fmadd_ps(a_i, b1, x7);
  }
  _mm512_mask_storeu_ps(c, s0, x0);
  _mm512_mask_storeu_ps(c + 16, s1, x1);
  _mm512_mask_storeu_ps(c + ldc, s0, x2);
  _mm512_mask_storeu_ps(c + ldc + 16, s1, x3);
  _mm512_mask_storeu_ps(c + 2 * ldc, s0, x4);
  _mm512_mask_storeu_ps(c + 2 * ldc + 16, s1, x5);
  _mm512_mask_storeu_ps(c + 3 * ldc, s0, x6);
  _mm512_mask_storeu_ps(c + 3 * ldc + 16, s1, x7);
}

// Two full panels at once, 4 x 64 (16 accumulators): per k four loads of b and four broadcasts
// of a for sixteen FMAs, where 4 x 32 tiles load b and a as often for half the FMAs (b's panels
// are read from L2 at these sizes, and the loads bound the smaller tile).
template <bool kTransA>
__attribute__((target("avx512f,avx2,fma"), always_inline)) inline void Tile4x64(
    const float* a, int64_t lda, const float* panel0, const float* panel1, float* c,
    int64_t ldc, int64_t k_lo, int64_t k_hi) {
  __m512 x[4][4];
  for (auto& row : x)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t k = k_lo; k < k_hi; ++k) {
    const __m512 b0 = _mm512_loadu_ps(panel0 + k * kWidePanel);
    const __m512 b1 = _mm512_loadu_ps(panel0 + k * kWidePanel + 16);
    const __m512 b2 = _mm512_loadu_ps(panel1 + k * kWidePanel);
    const __m512 b3 = _mm512_loadu_ps(panel1 + k * kWidePanel + 16);
    for (int i = 0; i < 4; ++i) {
      const __m512 a_i = _mm512_set1_ps(*At<kTransA>(a, lda, i, k));
      x[i][0] = _mm512_fmadd_ps(a_i, b0, x[i][0]);
      x[i][1] = _mm512_fmadd_ps(a_i, b1, x[i][1]);
      x[i][2] = _mm512_fmadd_ps(a_i, b2, x[i][2]);
      x[i][3] = _mm512_fmadd_ps(a_i, b3, x[i][3]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, x[i][j]);
}

// ``Rows4`` with AVX-512 against b packed in kWidePanel columns: two full panels inside
// [n_lo, n_hi) at a time in ``Tile4x64``; otherwise per panel, two loads of b, four broadcasts of
// a, eight FMAs into 4 x 32 accumulators, masked stores writing only the columns in [n_lo, n_hi).
// Where that range holds 16 columns or fewer of one half of a panel, one register of columns
// (four accumulators) is computed.
template <bool kTransA>
__attribute__((target("avx512f,avx2,fma"))) void Rows4Wide(
    const float* a, int64_t lda, const float* b, int64_t k_len, int64_t n_len, float* c,
    int64_t ldc, int64_t k_lo, int64_t k_hi, int64_t n_lo, int64_t n_hi) {
  for (int64_t n0 = n_lo / kWidePanel * kWidePanel; n0 < n_hi; n0 += kWidePanel) {
    if (n0 >= n_lo && n0 + 2 * kWidePanel <= std::min(n_hi, n_len)) {
      Tile4x64<kTransA>(a, lda, b + n0 * k_len, b + (n0 + kWidePanel) * k_len, c + n0, ldc, k_lo,
                        k_hi);
      n0 += kWidePanel;  // And the loop's own step.
      continue;
    }
    const int64_t w = std::min(kWidePanel, n_len - n0);
    const int64_t from = std::max(n_lo, n0) - n0, to = std::min(n_hi, n0 + w) - n0;
    const __mmask16 l0 = Lanes(0, w), l1 = Lanes(0, w - 16);
    const __mmask16 s0 = Lanes(from, to), s1 = Lanes(from - 16, to - 16);
    const float* panel = b + n0 * k_len;
    if (s0 != 0 && s1 != 0) {
      if (w == kWidePanel) {
        Tile4x32<kTransA, false>(a, lda, panel, w, c + n0, ldc, k_lo, k_hi, l0, l1, s0, s1);
      } else {
        Tile4x32<kTransA, true>(a, lda, panel, w, c + n0, ldc, k_lo, k_hi, l0, l1, s0, s1);
      }
      continue;
    }
    const int64_t half = s0 != 0 ? 0 : 16;
    const __mmask16 load = half ? l1 : l0, store = half ? s1 : s0;
    float* c0 = c + n0 + half;
    __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
    for (int64_t k = k_lo; k < k_hi; ++k) {
      const __m512 b0 = _mm512_maskz_loadu_ps(load, panel + k * w + half);
      x0 = _mm512_fmadd_ps(_mm512_set1_ps(*At<kTransA>(a, lda, 0, k)), b0, x0);
      x1 = _mm512_fmadd_ps(_mm512_set1_ps(*At<kTransA>(a, lda, 1, k)), b0, x1);
      x2 = _mm512_fmadd_ps(_mm512_set1_ps(*At<kTransA>(a, lda, 2, k)), b0, x2);
      x3 = _mm512_fmadd_ps(_mm512_set1_ps(*At<kTransA>(a, lda, 3, k)), b0, x3);
    }
    _mm512_mask_storeu_ps(c0, store, x0);
    _mm512_mask_storeu_ps(c0 + ldc, store, x1);
    _mm512_mask_storeu_ps(c0 + 2 * ldc, store, x2);
    _mm512_mask_storeu_ps(c0 + 3 * ldc, store, x3);
  }
}

// The tile of this CPU (``Wide``) against b packed in ``PanelWidth()`` columns.
inline int64_t PanelWidth() { return Wide() ? kWidePanel : kPanel; }

template <bool kTransA>
inline void Product4(const float* a, int64_t lda, const float* b, int64_t k_len, int64_t n_len,
                     float* c, int64_t ldc, int64_t k_lo, int64_t k_hi, int64_t n_lo,
                     int64_t n_hi) {
  if (Wide()) {
    Rows4Wide<kTransA>(a, lda, b, k_len, n_len, c, ldc, k_lo, k_hi, n_lo, n_hi);
  } else {
    Rows4<kTransA>(a, lda, b, k_len, n_len, c, ldc, k_lo, k_hi, n_lo, n_hi);
  }
}

}  // namespace t5like::tile
#endif  // T5LIKE_X86

#endif  // T5LIKE_KERNELS_TILE_H_
