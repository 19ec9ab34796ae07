// The QKV norms of attention with RoPE after them, forward and backward, for XLA:CPU: each
// head's vector x [D] becomes y = rotate(x * rsqrt(mean(x^2) + eps) * scale) (the rotation by
// its position's sin / cos, pairs (i, i + D/2); none for v), in float32, from float32 or bfloat16
// x. Backward: dx (x's dtype) and d scale from d y.
//
// XLA:CPU runs the same as ~10 kernels a layer (casts, the norm's reductions, its scale
// broadcast to full size as an operand, the rotation's halves and concatenation) over
// [batch, length, heads, head_dim] in float32 (docs/performance.md); here each row of D is
// read once and written once, forward and backward.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kChunkRows = 256;  // Rows per work item; d scale sums per item, in order.

// Rows of x and where their rotation lives: row r is position r / heads.
struct Shape {
  int64_t rows, d, heads;
  bool rope;
};

#ifdef T5LIKE_X86
__attribute__((target("avx2,fma"))) inline __m256 Load8(const float* p) {
  return _mm256_loadu_ps(p);
}

__attribute__((target("avx2,fma"))) inline __m256 Load8(const uint16_t* p) {  // bfloat16
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) inline void Store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}

// float32 -> bfloat16 rounding to nearest even, as XLA converts; NaN stays a (quiet) NaN.
__attribute__((target("avx2,fma"))) inline void Store8(uint16_t* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)),
                         nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r),
                                          _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// The row's normalised x * r ([D], into xr) and r = rsqrt(mean(x^2) + eps).
template <typename T>
__attribute__((target("avx2,fma"))) inline float Normalise(const T* x, int64_t d, float eps,
                                                          float* xr) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    const __m256 v = Load8(x + c);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  const float r = 1.0f / std::sqrt(t5like::HorizontalSum(ss) / static_cast<float>(d) + eps);
  const __m256 r8 = _mm256_set1_ps(r);
  for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(xr + c, _mm256_mul_ps(Load8(x + c), r8));
  return r;
}

template <typename T>
__attribute__((target("avx2,fma"))) void ForwardRows(const Shape& sh, const T* x,
                                                     const float* scale, const float* sin,
                                                     const float* cos, float eps, float* y,
                                                     int64_t chunk) {
  const int64_t d = sh.d, half = d / 2;
  std::vector<float> xr(d);
  const int64_t end = std::min(sh.rows, (chunk + 1) * kChunkRows);
  for (int64_t row = chunk * kChunkRows; row < end; ++row) {
    Normalise(x + row * d, d, eps, xr.data());
    float* out = y + row * d;
    if (!sh.rope) {
      for (int64_t c = 0; c < d; c += 8)
        Store8(out + c, _mm256_mul_ps(_mm256_loadu_ps(xr.data() + c), _mm256_loadu_ps(scale + c)));
      continue;
    }
    const float *s = sin + row / sh.heads * half, *co = cos + row / sh.heads * half;
    for (int64_t c = 0; c < half; c += 8) {
      const __m256 n1 = _mm256_mul_ps(_mm256_loadu_ps(xr.data() + c), _mm256_loadu_ps(scale + c));
      const __m256 n2 = _mm256_mul_ps(_mm256_loadu_ps(xr.data() + half + c),
                                      _mm256_loadu_ps(scale + half + c));
      const __m256 s8 = _mm256_loadu_ps(s + c), c8 = _mm256_loadu_ps(co + c);
      Store8(out + c, _mm256_fmsub_ps(n1, c8, _mm256_mul_ps(n2, s8)));
      Store8(out + half + c, _mm256_fmadd_ps(n2, c8, _mm256_mul_ps(n1, s8)));
    }
  }
}

// dx for the chunk's rows and the chunk's share of d scale (dscale_part [D]).
template <typename T>
__attribute__((target("avx2,fma"))) void BackwardRows(const Shape& sh, const T* x,
                                                      const float* scale, const float* sin,
                                                      const float* cos, const float* dy,
                                                      float eps, T* dx, float* dscale_part,
                                                      int64_t chunk) {
  const int64_t d = sh.d, half = d / 2;
  std::vector<float> xr(d), dn(d);
  std::fill(dscale_part, dscale_part + d, 0.0f);
  const int64_t end = std::min(sh.rows, (chunk + 1) * kChunkRows);
  for (int64_t row = chunk * kChunkRows; row < end; ++row) {
    const float r = Normalise(x + row * d, d, eps, xr.data());
    const float* g = dy + row * d;
    if (sh.rope) {  // The rotation's transpose: d n = rotate(d y) by -angle.
      const float *s = sin + row / sh.heads * half, *co = cos + row / sh.heads * half;
      for (int64_t c = 0; c < half; c += 8) {
        const __m256 g1 = _mm256_loadu_ps(g + c), g2 = _mm256_loadu_ps(g + half + c);
        const __m256 s8 = _mm256_loadu_ps(s + c), c8 = _mm256_loadu_ps(co + c);
        _mm256_storeu_ps(dn.data() + c, _mm256_fmadd_ps(g1, c8, _mm256_mul_ps(g2, s8)));
        _mm256_storeu_ps(dn.data() + half + c, _mm256_fmsub_ps(g2, c8, _mm256_mul_ps(g1, s8)));
      }
    } else {
      std::memcpy(dn.data(), g, d * sizeof(float));
    }
    // y = x r s, r = (mean(x^2) + eps)^-1/2  =>  dx = r (gs - xr mean(gs xr)) with gs = dn s;
    // d scale = sum over rows of dn xr.
    __m256 dot = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 dn8 = _mm256_loadu_ps(dn.data() + c), xr8 = _mm256_loadu_ps(xr.data() + c);
      _mm256_storeu_ps(dscale_part + c,
                       _mm256_fmadd_ps(dn8, xr8, _mm256_loadu_ps(dscale_part + c)));
      const __m256 gs = _mm256_mul_ps(dn8, _mm256_loadu_ps(scale + c));
      _mm256_storeu_ps(dn.data() + c, gs);
      dot = _mm256_fmadd_ps(gs, xr8, dot);
    }
    const __m256 mean = _mm256_set1_ps(t5like::HorizontalSum(dot) / static_cast<float>(d));
    const __m256 r8 = _mm256_set1_ps(r);
    for (int64_t c = 0; c < d; c += 8) {
      const __m256 gs = _mm256_loadu_ps(dn.data() + c), xr8 = _mm256_loadu_ps(xr.data() + c);
      Store8(dx + row * d + c, _mm256_mul_ps(r8, _mm256_fnmadd_ps(xr8, mean, gs)));
    }
  }
}
#endif

// The call's shape from x [..., D] (float32 or bfloat16), scale [D] and sin / cos [P, D / 2]
// (P dividing x's rows; both empty: no rotation), or an error.
ffi::Error ReadShape(ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::F32> sin,
                     ffi::Buffer<ffi::F32> cos, Shape& sh) {
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto dims = x.dimensions();
  const bool typed = x.element_type() == ffi::DataType::F32 ||
                     x.element_type() == ffi::DataType::BF16;
  const int64_t d = dims.size() >= 1 ? dims[dims.size() - 1] : 0;
  if (typed && d > 0 && d % 16 == 0 && scale.element_count() == static_cast<size_t>(d)) {
    const int64_t rows = static_cast<int64_t>(x.element_count()) / d;
    const int64_t positions = static_cast<int64_t>(sin.element_count()) / (d / 2);
    const bool rope_ok = sin.element_count() == cos.element_count() &&
                         sin.element_count() == static_cast<size_t>(positions * (d / 2)) &&
                         (positions == 0 || rows % positions == 0);
    sh = Shape{rows, d, positions > 0 ? rows / positions : 1, positions > 0};
    if (rope_ok) return ffi::Error::Success();
  }
  return ffi::Error::InvalidArgument(
      "head_norm wants x [..., D] float32 or bfloat16 with D % 16 == 0, scale [D], sin and cos "
      "[P, D / 2] with P dividing x's rows (or both empty)");
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                       ffi::Buffer<ffi::F32> sin, ffi::Buffer<ffi::F32> cos, float eps,
                       ffi::ResultBuffer<ffi::F32> y) {
#ifdef T5LIKE_X86
  Shape sh;
  if (ffi::Error e = ReadShape(x, scale, sin, cos, sh); e.failure()) return e;
  if (y->element_count() != x.element_count())
    return ffi::Error::InvalidArgument("head_norm's output is shaped like x");
  const float *sc = scale.typed_data(), *si = sin.typed_data(), *co = cos.typed_data();
  float* out = y->typed_data();
  const int64_t chunks = (sh.rows + kChunkRows - 1) / kChunkRows;
  if (x.element_type() == ffi::DataType::F32) {
    const float* xs = static_cast<const float*>(x.untyped_data());
    t5like::ParallelFor(pool, chunks, [=](int64_t i) {
      ForwardRows(sh, xs, sc, si, co, eps, out, i);
    });
  } else {
    const uint16_t* xs = static_cast<const uint16_t*>(x.untyped_data());
    t5like::ParallelFor(pool, chunks, [=](int64_t i) {
      ForwardRows(sh, xs, sc, si, co, eps, out, i);
    });
  }
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("head_norm is built for x86 only");
#endif
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::Buffer<ffi::F32> scale,
                        ffi::Buffer<ffi::F32> sin, ffi::Buffer<ffi::F32> cos,
                        ffi::Buffer<ffi::F32> dy, float eps, ffi::Result<ffi::AnyBuffer> dx,
                        ffi::ResultBuffer<ffi::F32> dscale) {
#ifdef T5LIKE_X86
  Shape sh;
  if (ffi::Error e = ReadShape(x, scale, sin, cos, sh); e.failure()) return e;
  if (dy.element_count() != x.element_count() || dx->element_count() != x.element_count() ||
      dx->element_type() != x.element_type() ||
      dscale->element_count() != static_cast<size_t>(sh.d))
    return ffi::Error::InvalidArgument(
        "head_norm's backward wants d y shaped like x, d x like x, d scale [D]");
  const float *sc = scale.typed_data(), *si = sin.typed_data(), *co = cos.typed_data();
  const float* g = dy.typed_data();
  const int64_t chunks = (sh.rows + kChunkRows - 1) / kChunkRows;
  std::vector<float> parts(chunks * sh.d);
  float* part = parts.data();
  if (x.element_type() == ffi::DataType::F32) {
    const float* xs = static_cast<const float*>(x.untyped_data());
    float* out = static_cast<float*>(dx->untyped_data());
    t5like::ParallelFor(pool, chunks, [=](int64_t i) {
      BackwardRows(sh, xs, sc, si, co, g, eps, out, part + i * sh.d, i);
    });
  } else {
    const uint16_t* xs = static_cast<const uint16_t*>(x.untyped_data());
    uint16_t* out = static_cast<uint16_t*>(dx->untyped_data());
    t5like::ParallelFor(pool, chunks, [=](int64_t i) {
      BackwardRows(sh, xs, sc, si, co, g, eps, out, part + i * sh.d, i);
    });
  }
  float* ds = dscale->typed_data();  // Chunks summed in order: the same result on any threads.
  std::fill(ds, ds + sh.d, 0.0f);
  for (int64_t i = 0; i < chunks; ++i)
    for (int64_t c = 0; c < sh.d; ++c) ds[c] += part[i * sh.d + c];
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("head_norm is built for x86 only");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeHeadNormFwd, ForwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // x [..., D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale [D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin [P, D / 2] or empty
                                  .Arg<ffi::Buffer<ffi::F32>>()   // cos [P, D / 2] or empty
                                  .Attr<float>("eps")
                                  .Ret<ffi::Buffer<ffi::F32>>()   // y [..., D]
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeHeadNormBwd, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // x [..., D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale [D]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // sin [P, D / 2] or empty
                                  .Arg<ffi::Buffer<ffi::F32>>()   // cos [P, D / 2] or empty
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d y [..., D]
                                  .Attr<float>("eps")
                                  .Ret<ffi::AnyBuffer>()          // d x [..., D], x's dtype
                                  .Ret<ffi::Buffer<ffi::F32>>()   // d scale [D]
);
