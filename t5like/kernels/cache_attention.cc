// One query token per row attending over its key/value cache, float32, for XLA:CPU's decode
// step: out = softmax over the valid slots of (q . k) times v, per (batch, kv head), with the
// group's query rows (GQA) sharing each key and value read.
//
// XLA:CPU runs the two batched products of this (one query row per batch and head) on Eigen at
// ~11-15 GB/s with a masked softmax between them; here each pair's keys and values are read
// once, only at valid slots (a cache's unwritten tail is skipped), on XLA's intra-op threads.
// Same arithmetic as inference/cache.py::attend: float32 scores, max-subtracted softmax, and
// zeros for a row with no valid slot.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"

namespace ffi = xla::ffi;

namespace {

#ifdef T5LIKE_X86
// One (batch, kv head) pair: R query rows of d (a multiple of 8) against s_len slots.
__attribute__((target("avx2,fma"))) void Pair(const float* q, const float* k, const float* v,
                                              const bool* valid, float* out, int64_t r_len,
                                              int64_t s_len, int64_t d, float* scores) {
  for (int64_t r = 0; r < r_len; ++r) {
    const float* q_r = q + r * d;
    float* out_r = out + r * d;
    float max_score = -INFINITY;
    for (int64_t s = 0; s < s_len; ++s) {
      if (!valid[s]) continue;
      const float* k_s = k + s * d;
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();  // Two chains of FMAs.
      int64_t i = 0;
      for (; i + 16 <= d; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q_r + i), _mm256_loadu_ps(k_s + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q_r + i + 8), _mm256_loadu_ps(k_s + i + 8), acc1);
      }
      if (i < d) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q_r + i), _mm256_loadu_ps(k_s + i), acc0);
      scores[s] = t5like::HorizontalSum(_mm256_add_ps(acc0, acc1));
      max_score = std::max(max_score, scores[s]);
    }
    std::fill(out_r, out_r + d, 0.0f);
    if (max_score == -INFINITY) continue;  // No valid slot: zeros, as the masked softmax gives.
    float total = 0.0f;
    for (int64_t s = 0; s < s_len; ++s) {
      if (!valid[s]) continue;
      scores[s] = std::exp(scores[s] - max_score);
      total += scores[s];
    }
    const __m256 scale = _mm256_set1_ps(1.0f / total);
    for (int64_t i0 = 0; i0 < d; i0 += 64) {  // Up to 8 vectors of the output at a time.
      const int64_t blocks = std::min<int64_t>(8, (d - i0) / 8);
      __m256 acc[8];
      for (int64_t j = 0; j < blocks; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t s = 0; s < s_len; ++s) {
        if (!valid[s]) continue;
        const __m256 p = _mm256_set1_ps(scores[s]);
        const float* v_s = v + s * d + i0;
        for (int64_t j = 0; j < blocks; ++j)
          acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v_s + 8 * j), acc[j]);
      }
      for (int64_t j = 0; j < blocks; ++j)
        _mm256_storeu_ps(out_r + i0 + 8 * j, _mm256_mul_ps(acc[j], scale));
    }
  }
}
#endif

ffi::Error CacheAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_bgrd,
                              ffi::Buffer<ffi::F32> k_bgsd, ffi::Buffer<ffi::F32> v_bgsd,
                              ffi::Buffer<ffi::PRED> valid_bs,
                              ffi::ResultBuffer<ffi::F32> out_bgrd) {
#ifdef T5LIKE_X86
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto qd = q_bgrd.dimensions(), kd = k_bgsd.dimensions(), vd = valid_bs.dimensions();
  const auto v_dims = v_bgsd.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 2 || v_dims.size() != 4 ||
      !std::equal(kd.begin(), kd.end(), v_dims.begin()) || qd[0] != kd[0] || qd[1] != kd[1] ||
      qd[3] != kd[3] || kd[3] % 8 != 0 || vd[0] != kd[0] || vd[1] != kd[2])
    return ffi::Error::InvalidArgument(
        "cache_attention wants q [B, G, R, D], k and v [B, G, S, D], valid [B, S], D % 8 == 0");
  const float *q = q_bgrd.typed_data(), *k = k_bgsd.typed_data(), *v = v_bgsd.typed_data();
  const bool* valid = valid_bs.typed_data();
  float* out = out_bgrd->typed_data();
  const int64_t heads = kd[1], r_len = qd[2], s_len = kd[2], d = kd[3];
  t5like::ParallelFor(pool, kd[0] * heads, [=](int64_t pair) {
    thread_local std::vector<float> scores;
    scores.resize(s_len);
    Pair(q + pair * r_len * d, k + pair * s_len * d, v + pair * s_len * d,
         valid + (pair / heads) * s_len, out + pair * r_len * d, r_len, s_len, d, scores.data());
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
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // valid [B, S]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [B, G, R, D]
);
