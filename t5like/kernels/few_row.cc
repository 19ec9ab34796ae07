// Few-row float32 matmul for XLA:CPU: y [M, N] = a [M, K] . w [N, K]^T, M small (decode steps).
//
// A decode step multiplies a few rows (one per sequence) by every weight once per token, so it
// is bound by how fast the weights stream from memory. XLA:CPU's dot kernels stream an [N, K]
// weight at ~10-13 GB/s at eight rows on a 2-core AVX2 host that reads ~30 GB/s; this kernel
// keeps the rows in L1, streams each weight row once with a software prefetch ahead of it, and
// splits the weight rows over XLA's intra-op threads (~16 GB/s, docs/performance.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kRowsPerItem = 32;       // Weight rows a thread takes at a time.
constexpr int64_t kPrefetchFloats = 2048;  // How far ahead of the loads the prefetch runs (8 KiB).

#ifdef T5LIKE_X86
// Rows [n0, n1) of w against M (<= 8) rows of a; K a multiple of 8.
template <int M>
__attribute__((target("avx2,fma"))) void Rows(const float* w, const float* a, float* y,
                                              int64_t n0, int64_t n1, int64_t n_total,
                                              int64_t k_len) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* w_row = w + n * k_len;
    __m256 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < k_len; k += 8) {
      _mm_prefetch(reinterpret_cast<const char*>(w_row + k + kPrefetchFloats), _MM_HINT_T0);
      const __m256 w_vec = _mm256_loadu_ps(w_row + k);
      for (int m = 0; m < M; ++m)
        acc[m] = _mm256_fmadd_ps(w_vec, _mm256_loadu_ps(a + m * k_len + k), acc[m]);
    }
    for (int m = 0; m < M; ++m) y[m * n_total + n] = t5like::HorizontalSum(acc[m]);
  }
}

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr RowsFn kRows[] = {nullptr, Rows<1>, Rows<2>, Rows<3>, Rows<4>,
                            Rows<5>, Rows<6>, Rows<7>, Rows<8>};
#endif

#ifdef T5LIKE_X86
// silu(g) * u = g * sigmoid(g) * u over n floats; sigmoid from exp(-|g|) (never overflows).
__attribute__((target("avx2,fma"))) void SiluTimes(const float* g, const float* u, float* out,
                                                   int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 e = t5like::ExpNonPositive(_mm256_or_ps(gi, sign));  // exp(-|g|)
    // sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0 (the sign bit picks).
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, gi), _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gi, sig), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}
#endif

// The few-row product with a decode step's neighbouring operations, each optional (none: the
// plain product after a copy of a's few rows): the rows of a RMS-normed (``x / rms(x) * scale``,
// ``norm``) and times ``factor``; then with ``glu`` silu(first half of y) * (second half)
// [M, N / 2]; then plus ``residual`` (``add``). One call instead of up to six small XLA
// operations around the product.
ffi::Error FewRowFusedImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a_mk,
                           ffi::Buffer<ffi::F32> scale_k, ffi::Buffer<ffi::F32> w_nk,
                           ffi::Buffer<ffi::F32> residual, int32_t norm, float eps, float factor,
                           int32_t glu, int32_t add, ffi::ResultBuffer<ffi::F32> y_mn) {
#ifdef T5LIKE_X86
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto a_dims = a_mk.dimensions(), w_dims = w_nk.dimensions(), y_dims = y_mn->dimensions();
  if (a_dims.size() != 2 || w_dims.size() != 2 || a_dims[1] != w_dims[1] || a_dims[1] % 8 != 0 ||
      (norm && scale_k.element_count() != a_dims[1]) || y_dims.size() != 2 ||
      y_dims[0] != a_dims[0] || y_dims[1] * (glu ? 2 : 1) != w_dims[0] ||
      (add && residual.element_count() != y_dims[0] * y_dims[1]))
    return ffi::Error::InvalidArgument(
        "few_row_fused wants a [M, K], scale [K], w [N, K], residual and y [M, N] (glu: "
        "[M, N / 2]), K % 8 == 0");
  const int64_t m = a_dims[0], n = w_dims[0], k = a_dims[1];
  std::vector<float> rows_mk(a_mk.typed_data(), a_mk.typed_data() + m * k);
  for (int64_t r = 0; r < m && (norm || factor != 1.0f); ++r) {
    float* x = rows_mk.data() + r * k;
    float inv = 1.0f;
    if (norm) {
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += x[i] * x[i];
      inv = 1.0f / std::sqrt(sum / static_cast<float>(k) + eps);
    }
    const float* scale = scale_k.typed_data();
    for (int64_t i = 0; i < k; ++i) x[i] = (norm ? x[i] * inv * scale[i] : x[i]) * factor;
  }
  const float *a = rows_mk.data(), *w = w_nk.typed_data(), *res = residual.typed_data();
  float* y = y_mn->typed_data();
  const int64_t n_out = glu ? n / 2 : n;
  t5like::ParallelFor(pool, (n_out + kRowsPerItem - 1) / kRowsPerItem, [=](int64_t item) {
    const int64_t n0 = item * kRowsPerItem, n1 = std::min(n_out, n0 + kRowsPerItem);
    if (!glu) {
      for (int64_t m0 = 0; m0 < m; m0 += 8)
        kRows[std::min<int64_t>(8, m - m0)](w, a + m0 * k, y + m0 * n, n0, n1, n, k);
    } else {  // Gate rows [n0, n1) and up rows [n_out + n0, n_out + n1) into [m, 32] buffers.
      thread_local std::vector<float> gate, up;
      gate.resize(m * kRowsPerItem);
      up.resize(m * kRowsPerItem);
      for (int64_t m0 = 0; m0 < m; m0 += 8) {
        const RowsFn rows = kRows[std::min<int64_t>(8, m - m0)];
        rows(w, a + m0 * k, gate.data() + m0 * kRowsPerItem - n0, n0, n1, kRowsPerItem, k);
        rows(w + n_out * k, a + m0 * k, up.data() + m0 * kRowsPerItem - n0, n0, n1,
             kRowsPerItem, k);
      }
      for (int64_t r = 0; r < m; ++r)
        SiluTimes(gate.data() + r * kRowsPerItem, up.data() + r * kRowsPerItem,
                  y + r * n_out + n0, n1 - n0);
    }
    for (int64_t r = 0; add && r < m; ++r)
      for (int64_t j = n0; j < n1; ++j) y[r * n_out + j] = res[r * n_out + j] + y[r * n_out + j];
  });
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("few_row_fused is built for x86 only");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeFewRowFused, FewRowFusedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // a [M, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // RMSNorm scale [K] (norm)
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w [N, K]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // residual like y (add)
                                  .Attr<int32_t>("norm")
                                  .Attr<float>("eps")
                                  .Attr<float>("factor")
                                  .Attr<int32_t>("glu")
                                  .Attr<int32_t>("add")
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y [M, N] or [M, N / 2]
);

extern "C" int t5like_cpu_kernels_supported() { return t5like::CpuSupported() ? 1 : 0; }
