// Register-tile products of the train step's attention kernel (attention_train.cc): c = a b for
// four rows of a at a time against b packed into 16-column panels, AVX2 + FMA.
#ifndef T5LIKE_KERNELS_TILE_H_
#define T5LIKE_KERNELS_TILE_H_

#include <algorithm>
#include <cstdint>

#include "common.h"

#ifdef T5LIKE_X86
namespace t5like::tile {

constexpr int64_t kPanel = 16;  // Columns of b per packed panel.

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

// b [k_len, n_len] (element (k, n) at x[k * k_stride + n * n_stride]) packed as panels of 16
// columns, each [k_len, 16] contiguous (the last one [k_len, 8] when n_len % 16 == 8), so the
// products below read b sequentially. Either stride is 1: rows (n_stride 1) are copied, columns
// (k_stride 1, a transpose) go through 8 x 8 register transposes; k_len and n_len are multiples
// of 8.
inline __attribute__((target("avx2,fma"))) void Pack(const float* x, int64_t k_len, int64_t n_len,
                                              int64_t k_stride, int64_t n_stride, float* out) {
  for (int64_t n0 = 0; n0 < n_len; n0 += kPanel) {
    const int64_t w = std::min(kPanel, n_len - n0);
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

}  // namespace t5like::tile
#endif  // T5LIKE_X86

#endif  // T5LIKE_KERNELS_TILE_H_
