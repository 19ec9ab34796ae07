// The attention core of a train step, float32, forward and backward, for XLA:CPU:
// out = softmax over the allowed keys of (q k^T / sqrt(d)) v, per (batch, kv head) with the
// group's query heads (GQA) stacked as rows, and its gradients for q, k and v.
//
// XLA:CPU runs the core as batched products on heads-major copies of q, k and v with the
// softmax, its mask bias and their gradients as separate passes over [batch, heads, q, kv]
// (~60 GFLOP/s; docs/performance.md). Here each (batch, kv head) pair is one work item on XLA's
// intra-op threads: its products run in a register tile (tile.h: AVX2, or AVX-512 where the CPU
// has it) over each four-row block's key range only (its rows' first to last allowed key: the
// causal triangle and other segments' keys are skipped), with the probabilities recomputed in
// the backward from the forward's log-sum-exp (FlashAttention's recipe, without its tiling: a
// pair's [rows, keys] scores fit in L2 at the lengths this serves). Same arithmetic as
// models/attention.py::_attend: float32 scores of the scaled queries, max-subtracted softmax,
// masked keys excluded, zeros for a row with none.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "tile.h"

namespace ffi = xla::ffi;

namespace {

// The shapes of one call and where a (batch, kv head) pair's rows live. Rows r = (head in the
// group) * T + query; a block is four rows of one head (T % 4 == 0).
struct Shape {
  int64_t b, t, h, s, g, d, hm;  // hm: the mask's head axis, 1 or h.
  int64_t hg() const { return h / g; }
  int64_t rows() const { return hg() * t; }
  // Offset of row r's vector in a [B, T, H, D] array, for pair (bi, gi).
  int64_t q_at(int64_t bi, int64_t gi, int64_t r) const {
    return ((bi * t + r % t) * h + gi * hg() + r / t) * d;
  }
  int64_t kv_at(int64_t bi, int64_t gi, int64_t j) const { return ((bi * s + j) * g + gi) * d; }
  const bool* mask_row(const bool* mask, int64_t bi, int64_t gi, int64_t r) const {
    const int64_t head = hm == 1 ? 0 : gi * hg() + r / t;
    return mask + ((bi * hm + head) * t + r % t) * s;
  }
};

#ifdef T5LIKE_X86
using t5like::tile::Pack;
using t5like::tile::PanelWidth;
using t5like::tile::Product4;

// The first and last allowed key of a mask row of s keys (s % 8 == 0), eight at a time (a bool
// is one byte, 0 or 1); false for a row with none.
inline bool FirstLast(const bool* m, int64_t s, int64_t& first, int64_t& last) {
  uint64_t word = 0;
  int64_t j = 0;
  for (; j < s; j += 8) {
    std::memcpy(&word, m + j, 8);
    if (word != 0) break;
  }
  if (j == s) return false;
  first = j + __builtin_ctzll(word) / 8;  // Little-endian: byte i holds key j + i.
  for (j = s - 8;; j -= 8) {
    std::memcpy(&word, m + j, 8);
    if (word != 0) break;
  }
  last = j + 7 - __builtin_clzll(word) / 8;
  return true;
}

// Per four-row block: the keys [lo, hi) between its rows' first and last allowed key, widened
// to multiples of 8 (inside it a masked key still counts as masked); empty for dead rows. A mask
// without a head axis gives every head of the group the first head's blocks.
void BlockRanges(const Shape& sh, const bool* mask, int64_t bi, int64_t gi,
                 std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  const int64_t blocks = sh.rows() / 4, scanned = sh.hm == 1 ? sh.t : sh.rows();
  lo.assign(blocks, sh.s);
  hi.assign(blocks, 0);
  for (int64_t r = 0; r < scanned; ++r) {
    int64_t first, last;
    if (!FirstLast(sh.mask_row(mask, bi, gi, r), sh.s, first, last)) continue;
    lo[r / 4] = std::min(lo[r / 4], first / 8 * 8);
    hi[r / 4] = std::max(hi[r / 4], std::min(sh.s, (last + 8) / 8 * 8));
  }
  for (int64_t i = 0; i < blocks; ++i) {
    if (i >= scanned / 4) {
      lo[i] = lo[i % (scanned / 4)];
      hi[i] = hi[i % (scanned / 4)];
    }
    if (lo[i] >= hi[i]) lo[i] = hi[i] = 0;
  }
}

// Rows of a [B, T, H, D] array are H * D floats apart (2 KB and more), a stride the hardware
// prefetchers follow poorly: the row ``kAhead`` rows on is asked for while this one is read.
constexpr int64_t kAhead = 4;

inline void PrefetchRow(const float* row, int64_t d) {
  for (int64_t c = 0; c < d; c += 16) _mm_prefetch(reinterpret_cast<const char*>(row + c),
                                                    _MM_HINT_T0);
}

// The pair's query rows times ``factor``, [rows, d].
__attribute__((target("avx2,fma"))) void QueryRows(const Shape& sh, const float* q, int64_t bi,
                                                   int64_t gi, float factor, float* qs) {
  const __m256 f8 = _mm256_set1_ps(factor);
  for (int64_t r = 0; r < sh.rows(); ++r) {
    if (r + kAhead < sh.rows()) PrefetchRow(q + sh.q_at(bi, gi, r + kAhead), sh.d);
    const float* src = q + sh.q_at(bi, gi, r);
    for (int64_t c = 0; c < sh.d; c += 8)
      _mm256_storeu_ps(qs + r * sh.d + c, _mm256_mul_ps(_mm256_loadu_ps(src + c), f8));
  }
}

// All ones in the lanes of the allowed keys among mask[0..8) (bytes 0 or 1).
__attribute__((target("avx2,fma"))) inline __m256 Allowed(const bool* mask) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask));
  return _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256()));
}

// Scores of block rb's rows over its range into p [rows, s], then in place the probabilities:
// exp(score - lse) at allowed keys, 0 at masked ones. With lse_out, the softmax's own max and
// sum give the probabilities and the rows' log-sum-exp (+inf for a row with no allowed key).
__attribute__((target("avx2,fma"))) void Probabilities(
    const Shape& sh, const bool* mask, int64_t bi, int64_t gi, int64_t rb, int64_t lo,
    int64_t hi, const float* qs, const float* kt, float* p, const float* lse_in, float* lse_out) {
  float* p0 = p + rb * 4 * sh.s;
  Product4<false>(qs + rb * 4 * sh.d, sh.d, kt, sh.d, sh.s, p0, sh.s, 0, sh.d, lo, hi);
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t r = rb * 4 + i;
    const bool* m = sh.mask_row(mask, bi, gi, r);
    float* row = p0 + i * sh.s;
    float shift;
    if (lse_out != nullptr) {
      __m256 max8 = _mm256_set1_ps(-INFINITY);
      for (int64_t j = lo; j < hi; j += 8)
        max8 = _mm256_max_ps(max8, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY),
                                                     _mm256_loadu_ps(row + j), Allowed(m + j)));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, max8);
      shift = *std::max_element(lanes, lanes + 8);
    } else {
      shift = lse_in[r];
    }
    const __m256 shift8 = _mm256_set1_ps(shift);
    __m256 sum8 = _mm256_setzero_ps();
    for (int64_t j = lo; j < hi; j += 8) {
      const __m256 e = _mm256_and_ps(
          t5like::ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift8)), Allowed(m + j));
      _mm256_storeu_ps(row + j, e);
      sum8 = _mm256_add_ps(sum8, e);
    }
    if (lse_out == nullptr) continue;
    const float sum = t5like::HorizontalSum(sum8);
    if (sum == 0.0f) {  // No allowed key (or an empty range): zeros, and no gradient.
      lse_out[r] = INFINITY;
      continue;
    }
    lse_out[r] = shift + std::log(sum);
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t j = lo; j < hi; j += 8)
      _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
  }
}

// For each block of four keys: the rows [lo, hi) whose block ranges reach one of its keys.
void KeyBlockRows(const Shape& sh, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                  std::vector<int64_t>& klo, std::vector<int64_t>& khi) {
  klo.assign(sh.s / 4, sh.rows());
  khi.assign(sh.s / 4, 0);
  for (int64_t rb = 0; rb < static_cast<int64_t>(lo.size()); ++rb)
    for (int64_t jb = lo[rb] / 4; jb < hi[rb] / 4; ++jb) {
      klo[jb] = std::min(klo[jb], rb * 4);
      khi[jb] = std::max(khi[jb], rb * 4 + 4);
    }
}

// The forward of one (batch, kv head) pair: its rows of out and of the log-sum-exp.
__attribute__((target("avx2,fma"))) void ForwardPair(const Shape& sh, const float* q,
                                                     const float* k, const float* v,
                                                     const bool* mask, float* out, float* lse,
                                                     int64_t pair) {
  thread_local std::vector<float> qs, kt, vp, p, lse_r;
  thread_local std::vector<int64_t> lo, hi;
  const int64_t bi = pair / sh.g, gi = pair % sh.g, rows = sh.rows(), d = sh.d, s = sh.s;
  qs.resize(rows * d);
  kt.resize(d * s);
  vp.resize(s * d);
  p.resize(rows * s);
  lse_r.resize(rows);
  QueryRows(sh, q, bi, gi, 1.0f / std::sqrt(static_cast<float>(d)), qs.data());
  Pack(k + sh.kv_at(bi, gi, 0), d, s, 1, sh.g * d, kt.data(), PanelWidth());  // k^T [d, s]
  Pack(v + sh.kv_at(bi, gi, 0), s, d, sh.g * d, 1, vp.data(), PanelWidth());  // v [s, d]
  BlockRanges(sh, mask, bi, gi, lo, hi);
  for (int64_t rb = 0; rb < rows / 4; ++rb) {
    Probabilities(sh, mask, bi, gi, rb, lo[rb], hi[rb], qs.data(), kt.data(), p.data(),
                  nullptr, lse_r.data());
    // Four rows of one head: consecutive queries, H * D apart in out.
    Product4<false>(p.data() + rb * 4 * s, s, vp.data(), s, d, out + sh.q_at(bi, gi, rb * 4),
                    sh.h * d, lo[rb], hi[rb], 0, d);
  }
  for (int64_t r = 0; r < rows; ++r)
    lse[(bi * sh.h + gi * sh.hg() + r / sh.t) * sh.t + r % sh.t] = lse_r[r];
}

// The backward of one (batch, kv head) pair: its rows of dq, dk and dv.
__attribute__((target("avx2,fma"))) void BackwardPair(
    const Shape& sh, const float* q, const float* k, const float* v, const bool* mask,
    const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv,
    int64_t pair) {
  thread_local std::vector<float> qs, qp, kt, vt, kp, dor, dop, delta, lse_r, p, ds;
  thread_local std::vector<int64_t> lo, hi, klo, khi;
  const int64_t bi = pair / sh.g, gi = pair % sh.g, rows = sh.rows(), d = sh.d, s = sh.s;
  for (auto* x : {&qs, &qp, &dor, &dop}) x->resize(rows * d);
  for (auto* x : {&kt, &vt, &kp}) x->resize(d * s);
  for (auto* x : {&p, &ds}) x->resize(rows * s);
  delta.resize(rows);
  lse_r.resize(rows);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  QueryRows(sh, q, bi, gi, scale, qs.data());
  Pack(k + sh.kv_at(bi, gi, 0), d, s, 1, sh.g * d, kt.data(), PanelWidth());  // k^T [d, s]
  Pack(v + sh.kv_at(bi, gi, 0), d, s, 1, sh.g * d, vt.data(), PanelWidth());  // v^T [d, s]
  Pack(k + sh.kv_at(bi, gi, 0), s, d, sh.g * d, 1, kp.data(), PanelWidth());  // k [s, d] ...
  // ... then / sqrt(d).
  for (float& x : kp) x *= scale;
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kAhead < rows) {
      PrefetchRow(dout + sh.q_at(bi, gi, r + kAhead), d);
      PrefetchRow(out + sh.q_at(bi, gi, r + kAhead), d);
    }
    const float *g_r = dout + sh.q_at(bi, gi, r), *o_r = out + sh.q_at(bi, gi, r);
    __m256 dot8 = _mm256_setzero_ps();  // Eight partial sums (one chain is latency-bound).
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 g8 = _mm256_loadu_ps(g_r + c);
      _mm256_storeu_ps(dor.data() + r * d + c, g8);
      dot8 = _mm256_fmadd_ps(g8, _mm256_loadu_ps(o_r + c), dot8);
    }
    delta[r] = t5like::HorizontalSum(dot8);  // sum_j p_j dp_j, the softmax gradient's shift.
    lse_r[r] = lse[(bi * sh.h + gi * sh.hg() + r / sh.t) * sh.t + r % sh.t];
  }
  BlockRanges(sh, mask, bi, gi, lo, hi);
  for (int64_t rb = 0; rb < rows / 4; ++rb) {
    Probabilities(sh, mask, bi, gi, rb, lo[rb], hi[rb], qs.data(), kt.data(), p.data(),
                  lse_r.data(), nullptr);
    float* ds0 = ds.data() + rb * 4 * s;
    Product4<false>(dor.data() + rb * 4 * d, d, vt.data(), d, s, ds0, s, 0, d, lo[rb],
                    hi[rb]);  // dP = dout v^T
    for (int64_t i = 0; i < 4; ++i) {  // dS = P (dP - delta)
      const float* p_i = p.data() + (rb * 4 + i) * s;
      float* ds_i = ds0 + i * s;
      const float shift = delta[rb * 4 + i];
      for (int64_t j = lo[rb]; j < hi[rb]; ++j) ds_i[j] = p_i[j] * (ds_i[j] - shift);
    }
    Product4<false>(ds0, s, kp.data(), s, d, dq + sh.q_at(bi, gi, rb * 4), sh.h * d, lo[rb],
                    hi[rb], 0, d);  // dq = dS k / sqrt(d)
  }
  // dk = dS^T (q / sqrt(d)) and dv = P^T dout, four keys at a time over the rows that reach
  // them, reading dS and P transposed (zeros outside each block's key range).
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t from = lo[r / 4], to = hi[r / 4];
    for (float* x : {p.data() + r * s, ds.data() + r * s}) {
      std::fill(x, x + from, 0.0f);
      std::fill(x + to, x + s, 0.0f);
    }
  }
  Pack(qs.data(), rows, d, d, 1, qp.data(), PanelWidth());
  Pack(dor.data(), rows, d, d, 1, dop.data(), PanelWidth());
  KeyBlockRows(sh, lo, hi, klo, khi);
  for (int64_t jb = 0; jb < s / 4; ++jb) {
    const int64_t r_lo = std::min(klo[jb], khi[jb]), r_hi = khi[jb];
    Product4<true>(ds.data() + jb * 4, s, qp.data(), rows, d, dk + sh.kv_at(bi, gi, jb * 4),
                   sh.g * d, r_lo, r_hi, 0, d);
    Product4<true>(p.data() + jb * 4, s, dop.data(), rows, d, dv + sh.kv_at(bi, gi, jb * 4),
                   sh.g * d, r_lo, r_hi, 0, d);
  }
}
#endif

// The call's shape (sh) from q [B, T, H, D], k and v [B, S, G, D] and the mask [B, 1|H, T, S],
// or an error: shapes the kernels cannot serve, or a CPU without AVX2 + FMA.
ffi::Error ReadShape(ffi::Span<const int64_t> qd, ffi::Span<const int64_t> kd,
                     ffi::Span<const int64_t> vd, ffi::Span<const int64_t> md, Shape& sh) {
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  bool ok = qd.size() == 4 && kd.size() == 4 && vd.size() == 4 && md.size() == 4;
  if (ok) {
    sh = Shape{qd[0], qd[1], qd[2], kd[1], kd[2], qd[3], md[1]};
    ok = sh.g > 0 && sh.h % sh.g == 0 && kd[0] == sh.b && kd[3] == sh.d &&
         std::equal(kd.begin(), kd.end(), vd.begin()) && md[0] == sh.b && md[2] == sh.t &&
         md[3] == sh.s && (sh.hm == 1 || sh.hm == sh.h) && sh.d % 8 == 0 && sh.s % 8 == 0 &&
         sh.t % 4 == 0;
  }
  if (ok) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(
      "attention_train wants q [B, T, H, D], k and v [B, S, G, D], mask [B, 1 or H, T, S], G "
      "dividing H, D % 8 == 0, S % 8 == 0, T % 4 == 0 (and out, d out like q, lse [B, H, T])");
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_bthd,
                       ffi::Buffer<ffi::F32> k_bsgd, ffi::Buffer<ffi::F32> v_bsgd,
                       ffi::Buffer<ffi::PRED> mask_bhts, ffi::ResultBuffer<ffi::F32> out_bthd,
                       ffi::ResultBuffer<ffi::F32> lse_bht) {
#ifdef T5LIKE_X86
  Shape sh;
  if (ffi::Error e = ReadShape(q_bthd.dimensions(), k_bsgd.dimensions(), v_bsgd.dimensions(),
                               mask_bhts.dimensions(), sh);
      e.failure())
    return e;
  const float *q = q_bthd.typed_data(), *k = k_bsgd.typed_data(), *v = v_bsgd.typed_data();
  const bool* mask = mask_bhts.typed_data();
  float *out = out_bthd->typed_data(), *lse = lse_bht->typed_data();
  t5like::ParallelFor(pool, sh.b * sh.g,
                      [=](int64_t pair) { ForwardPair(sh, q, k, v, mask, out, lse, pair); });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("attention_train is built for x86 only");
#endif
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q_bthd,
                        ffi::Buffer<ffi::F32> k_bsgd, ffi::Buffer<ffi::F32> v_bsgd,
                        ffi::Buffer<ffi::PRED> mask_bhts, ffi::Buffer<ffi::F32> out_bthd,
                        ffi::Buffer<ffi::F32> lse_bht, ffi::Buffer<ffi::F32> dout_bthd,
                        ffi::ResultBuffer<ffi::F32> dq_bthd, ffi::ResultBuffer<ffi::F32> dk_bsgd,
                        ffi::ResultBuffer<ffi::F32> dv_bsgd) {
#ifdef T5LIKE_X86
  Shape sh;
  if (ffi::Error e = ReadShape(q_bthd.dimensions(), k_bsgd.dimensions(), v_bsgd.dimensions(),
                               mask_bhts.dimensions(), sh);
      e.failure())
    return e;
  if (out_bthd.element_count() != q_bthd.element_count() ||
      dout_bthd.element_count() != q_bthd.element_count() ||
      lse_bht.element_count() != static_cast<size_t>(sh.b * sh.h * sh.t))
    return ffi::Error::InvalidArgument("attention_train's backward wants out and d out shaped "
                                       "like q, lse [B, H, T]");
  const float *q = q_bthd.typed_data(), *k = k_bsgd.typed_data(), *v = v_bsgd.typed_data();
  const float *out = out_bthd.typed_data(), *lse = lse_bht.typed_data();
  const float* dout = dout_bthd.typed_data();
  const bool* mask = mask_bhts.typed_data();
  float *dq = dq_bthd->typed_data(), *dk = dk_bsgd->typed_data(), *dv = dv_bsgd->typed_data();
  t5like::ParallelFor(pool, sh.b * sh.g, [=](int64_t pair) {
    BackwardPair(sh, q, k, v, mask, out, lse, dout, dq, dk, dv, pair);
  });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("attention_train is built for x86 only");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeAttentionTrainFwd, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q [B, T, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k [B, S, G, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v [B, S, G, D]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask [B, 1 | H, T, S]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out [B, T, H, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // log-sum-exp [B, H, T]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeAttentionTrainBwd, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q [B, T, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // k [B, S, G, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // v [B, S, G, D]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // mask [B, 1 | H, T, S]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // out [B, T, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // log-sum-exp [B, H, T]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d out [B, T, H, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d q [B, T, H, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d k [B, S, G, D]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d v [B, S, G, D]
);
