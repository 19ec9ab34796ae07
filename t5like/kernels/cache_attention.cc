// One query token per row attending over its key/value cache, float32, for XLA:CPU's decode
// step: out = softmax over the valid slots of (q . k) times v, per (batch, kv head), with the
// group's query rows (GQA) sharing each key and value read.
//
// XLA:CPU runs the two batched products of this (one query row per batch and head) on Eigen at
// ~11-15 GB/s with a masked softmax between them; here each pair's keys and values are read
// once, only at valid slots (a cache's unwritten tail is skipped; each batch row's valid slots
// are listed once for all its heads), on XLA's intra-op threads. Scores come four keys at a time
// and the softmax's exponentials eight at a time (1.16x over one key and std::exp per slot).
// Same arithmetic as ops/reference.py::dot_product_attention: float32 scores, max-subtracted softmax, and
// zeros for a row with no valid slot.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"

namespace ffi = xla::ffi;

namespace {

#ifdef T5LIKE_X86
// The dot products of q (d floats, a multiple of 8) with four keys, as one vector's lanes 0..3:
// four independent FMA chains and one horizontal reduction for the four.
__attribute__((target("avx2,fma"))) inline __m128 Dot4(const float* q, const float* k0,
                                                      const float* k1, const float* k2,
                                                      const float* k3, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 qi = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k0 + i), a0);
    a1 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k1 + i), a1);
    a2 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k2 + i), a2);
    a3 = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k3 + i), a3);
  }
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out = scale * sum_j p[j] v[idx[j]] over B vectors (8 B floats) of each value row; B fixed at
// compile time so the accumulators can live in registers.
template <int B>
__attribute__((target("avx2,fma"))) inline void WeightedValues(const float* p, const float* v,
                                                               const int32_t* idx, int64_t n,
                                                               int64_t d, __m256 scale,
                                                               float* out) {
  __m256 acc[B];
  for (int b = 0; b < B; ++b) acc[b] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* v_j = v + idx[j] * d;
    for (int b = 0; b < B; ++b) acc[b] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v_j + 8 * b), acc[b]);
  }
  for (int b = 0; b < B; ++b) _mm256_storeu_ps(out + 8 * b, _mm256_mul_ps(acc[b], scale));
}

// One query row of d floats (a multiple of 8) against the n valid slots listed in idx (keys and
// values at idx[j] * d) of one (batch, kv head) pair; scores holds at least n floats.
__attribute__((target("avx2,fma"))) void Row(const float* q_r, const float* k, const float* v,
                                             const int32_t* idx, int64_t n, float* out_r,
                                             int64_t d, float* scores) {
  std::fill(out_r, out_r + d, 0.0f);
  if (n == 0) return;  // No valid slot: zeros, as the masked softmax gives.
  int64_t j = 0;
  __m128 max4 = _mm_set1_ps(-INFINITY);
  for (; j + 4 <= n; j += 4) {
    const __m128 s = Dot4(q_r, k + idx[j] * d, k + idx[j + 1] * d, k + idx[j + 2] * d,
                          k + idx[j + 3] * d, d);
    _mm_storeu_ps(scores + j, s);
    max4 = _mm_max_ps(max4, s);
  }
  float tmp[4];
  _mm_storeu_ps(tmp, max4);
  float max_score = std::max(std::max(tmp[0], tmp[1]), std::max(tmp[2], tmp[3]));
  for (; j < n; ++j) {
    const float* kj = k + idx[j] * d;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q_r + i), _mm256_loadu_ps(kj + i), acc);
    scores[j] = t5like::HorizontalSum(acc);
    max_score = std::max(max_score, scores[j]);
  }
  const __m256 m8 = _mm256_set1_ps(max_score);
  __m256 tot8 = _mm256_setzero_ps();
  j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = t5like::ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(scores + j), m8));
    _mm256_storeu_ps(scores + j, e);
    tot8 = _mm256_add_ps(tot8, e);
  }
  float total = t5like::HorizontalSum(tot8);
  for (; j < n; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    total += scores[j];
  }
  const __m256 scale = _mm256_set1_ps(1.0f / total);
  int64_t i0 = 0;
  for (; i0 + 64 <= d; i0 += 64) WeightedValues<8>(scores, v + i0, idx, n, d, scale, out_r + i0);
  for (; i0 < d; i0 += 8) WeightedValues<1>(scores, v + i0, idx, n, d, scale, out_r + i0);
}

// Lists the valid slots of one mask row; returns their count.
int64_t ValidSlots(const bool* valid_s, int64_t s_len, int32_t* idx) {
  int64_t n = 0;
  for (int64_t s = 0; s < s_len; ++s)
    if (valid_s[s]) idx[n++] = static_cast<int32_t>(s);
  return n;
}
#endif

ffi::Error CacheAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_bgrd,
                              ffi::Buffer<ffi::F32> k_bgsd, ffi::Buffer<ffi::F32> v_bgsd,
                              ffi::Buffer<ffi::PRED> valid,
                              ffi::ResultBuffer<ffi::F32> out_bgrd) {
#ifdef T5LIKE_X86
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto qd = q_bgrd.dimensions(), kd = k_bgsd.dimensions(), vd = valid.dimensions();
  const auto v_dims = v_bgsd.dimensions();
  const bool per_row = vd.size() == 4;  // [B, G, R, S]: each query row its own mask.
  if (qd.size() != 4 || kd.size() != 4 || v_dims.size() != 4 ||
      !std::equal(kd.begin(), kd.end(), v_dims.begin()) || qd[0] != kd[0] || qd[1] != kd[1] ||
      qd[3] != kd[3] || kd[3] % 8 != 0 || (vd.size() != 2 && !per_row) || vd[0] != kd[0] ||
      vd[vd.size() - 1] != kd[2] || (per_row && (vd[1] != qd[1] || vd[2] != qd[2])))
    return ffi::Error::InvalidArgument(
        "cache_attention wants q [B, G, R, D], k and v [B, G, S, D], valid [B, S] or "
        "[B, G, R, S], D % 8 == 0");
  const float *q = q_bgrd.typed_data(), *k = k_bgsd.typed_data(), *v = v_bgsd.typed_data();
  const bool* mask = valid.typed_data();
  float* out = out_bgrd->typed_data();
  const int64_t heads = kd[1], r_len = qd[2], s_len = kd[2], d = kd[3];
  // Shared masks: each batch row's valid slots, listed once for its heads and query rows.
  std::vector<int32_t> idx(per_row ? 0 : kd[0] * s_len);
  std::vector<int64_t> count(per_row ? 0 : kd[0]);
  for (int64_t b = 0; !per_row && b < kd[0]; ++b)
    count[b] = ValidSlots(mask + b * s_len, s_len, idx.data() + b * s_len);
  const int32_t* idx_p = idx.data();
  const int64_t* count_p = count.data();
  t5like::ParallelFor(pool, kd[0] * heads, [=](int64_t pair) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int32_t> row_idx;
    scores.resize(s_len);
    row_idx.resize(s_len);
    const float *k_p = k + pair * s_len * d, *v_p = v + pair * s_len * d;
    for (int64_t r = 0; r < r_len; ++r) {
      const int64_t row = pair * r_len + r;
      if (per_row) {
        const int64_t n = ValidSlots(mask + row * s_len, s_len, row_idx.data());
        Row(q + row * d, k_p, v_p, row_idx.data(), n, out + row * d, d, scores.data());
      } else {
        const int64_t b = pair / heads;
        Row(q + row * d, k_p, v_p, idx_p + b * s_len, count_p[b], out + row * d, d,
            scores.data());
      }
    }
  });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("cache_attention is built for x86 only");
#endif
}


}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeCacheAttention, CacheAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q [B, G, R, D], scaled
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k [B, G, S, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v [B, G, S, D]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // valid [B, S] / [B, G, R, S]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [B, G, R, D]
);
