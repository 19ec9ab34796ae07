// One query token per row attending over its key/value cache, float32, for XLA:CPU's decode
// step: out = softmax over the valid slots of (q . k) times v, per (batch, kv head), with the
// group's query rows (GQA) sharing each key and value read.
//
// XLA:CPU runs the two batched products of this (one query row per batch and head) on Eigen at
// ~11-15 GB/s with a masked softmax between them; here each pair's keys and values are read
// once, only at valid slots (a cache's unwritten tail is skipped; each batch row's valid slots
// are listed once for all its heads), on XLA's intra-op threads. Scores come four keys at a time
// and the softmax's exponentials eight at a time (1.16x over one key and std::exp per slot).
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

// A new token's head vector as the model makes it: RMS-normed (x / rms(x) * scale) if ``scale``,
// then rotated (feature pairs i, i + d/2) if ``sin``; written to ``out``, times ``factor``.
void Prepare(const float* x, const float* scale, float eps, const float* sin, const float* cos,
             float factor, int64_t d, float* out) {
  float r = 1.0f;
  if (scale != nullptr) {
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum += x[i] * x[i];
    r = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
  }
  auto normed = [&](int64_t i) { return scale != nullptr ? x[i] * r * scale[i] : x[i]; };
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = normed(i), x2 = normed(i + half);
    out[i] = (sin != nullptr ? x1 * cos[i] - x2 * sin[i] : x1) * factor;
    out[i + half] = (sin != nullptr ? x2 * cos[i] + x1 * sin[i] : x2) * factor;
  }
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


// The decode step's self-attention after its q | k | v product: each new token's key and value
// (normed, the key rotated) written into the caches at ``slot`` in place, then its query heads
// (normed, rotated, scaled by d^-1/2) attending over the valid slots, per (batch, kv head) on
// XLA's threads. Replaces a dozen small XLA operations per layer (~50 us of an 8-row step).
ffi::Error AttentionStepImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> qkv_bn,
                             ffi::Buffer<ffi::F32> scales_3d, ffi::Buffer<ffi::F32> rope_2bh,
                             ffi::Buffer<ffi::F32> k_in, ffi::Buffer<ffi::F32> v_in,
                             ffi::Buffer<ffi::S32> slot_buf, ffi::Buffer<ffi::PRED> valid_bs,
                             int32_t norm, int32_t rope, float eps,
                             ffi::ResultBuffer<ffi::F32> out_bgrd,
                             ffi::ResultBuffer<ffi::F32> k_bgsd,
                             ffi::ResultBuffer<ffi::F32> v_bgsd) {
#ifdef T5LIKE_X86
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto kd = k_in.dimensions(), yd = qkv_bn.dimensions(), od = out_bgrd->dimensions();
  const auto rd = rope_2bh.dimensions(), sd = scales_3d.dimensions(), vd = valid_bs.dimensions();
  const auto bad = ffi::Error::InvalidArgument(
      "attention_step wants qkv [B, (H + 2G) D], scales [3, D], rope [2, B, D / 2], caches "
      "[B, G, S, D], valid [B, S], out [B, G, H / G, D], D % 8 == 0, G dividing H");
  if (kd.size() != 4 || yd.size() != 2 || od.size() != 4 || rd.size() != 3 || sd.size() != 2 ||
      vd.size() != 2 || kd[3] % 8 != 0 || yd[1] % kd[3] != 0)
    return bad;
  const int64_t b_len = kd[0], groups = kd[1], s_len = kd[2], d = kd[3];
  const int64_t heads = yd[1] / d - 2 * groups, r_len = heads / std::max<int64_t>(1, groups);
  if (yd[0] != b_len || groups <= 0 || heads <= 0 || heads % groups != 0 || od[0] != b_len ||
      od[1] != groups || od[2] != r_len || od[3] != d || vd[0] != b_len || vd[1] != s_len ||
      rd[0] != 2 || rd[1] != b_len || rd[2] * 2 != d || sd[0] != 3 || sd[1] != d)
    return bad;
  const int32_t slot = slot_buf.typed_data()[0];
  if (slot < 0 || slot >= s_len) return ffi::Error::InvalidArgument("slot outside the cache");
  float *k = k_bgsd->typed_data(), *v = v_bgsd->typed_data();
  if (k != k_in.typed_data()) std::copy_n(k_in.typed_data(), k_in.element_count(), k);
  if (v != v_in.typed_data()) std::copy_n(v_in.typed_data(), v_in.element_count(), v);
  const float *y = qkv_bn.typed_data(), *scales = scales_3d.typed_data();
  const float *sin = rope_2bh.typed_data(), *cos = sin + b_len * d / 2;
  const bool* mask = valid_bs.typed_data();
  float* out = out_bgrd->typed_data();
  std::vector<int32_t> idx(b_len * s_len);
  std::vector<int64_t> count(b_len);
  for (int64_t b = 0; b < b_len; ++b)
    count[b] = ValidSlots(mask + b * s_len, s_len, idx.data() + b * s_len);
  const int32_t* idx_p = idx.data();
  const int64_t* count_p = count.data();
  const float q_factor = 1.0f / std::sqrt(static_cast<float>(d));
  t5like::ParallelFor(pool, b_len * groups, [=](int64_t pair) {
    thread_local std::vector<float> scores, q;
    scores.resize(s_len);
    q.resize(d);
    const int64_t b = pair / groups, g = pair % groups;
    const float* y_b = y + b * yd[1];
    const float* sin_b = rope ? sin + b * d / 2 : nullptr;
    const float* cos_b = cos + b * d / 2;
    float *k_p = k + pair * s_len * d, *v_p = v + pair * s_len * d;
    Prepare(y_b + (heads + g) * d, norm ? scales + d : nullptr, eps, sin_b, cos_b, 1.0f, d,
            k_p + slot * d);
    Prepare(y_b + (heads + groups + g) * d, norm ? scales + 2 * d : nullptr, eps, nullptr,
            nullptr, 1.0f, d, v_p + slot * d);
    for (int64_t r = 0; r < r_len; ++r) {
      Prepare(y_b + (g * r_len + r) * d, norm ? scales : nullptr, eps, sin_b, cos_b, q_factor, d,
              q.data());
      Row(q.data(), k_p, v_p, idx_p + b * s_len, count_p[b], out + (pair * r_len + r) * d, d,
          scores.data());
    }
  });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("attention_step is built for x86 only");
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeAttentionStep, AttentionStepImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // qkv [B, (H + 2G) D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // norm scales [3, D]: q, k, v
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin, cos [2, B, D / 2]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k cache [B, G, S, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v cache [B, G, S, D]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // slot []
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // valid [B, S], slot marked
                                  .Attr<int32_t>("norm")
                                  .Attr<int32_t>("rope")
                                  .Attr<float>("eps")
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [B, G, R, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // k cache, aliased
                                  .Ret<ffi::Buffer<ffi::F32>>()   // v cache, aliased
);
