// What the CPU kernels share: the CPU check, a horizontal sum, an exponential, and the split of a
// kernel's work items over XLA's own intra-op threads (spinning threads of a second pool beside
// XLA's halved XLA's speed, docs/performance.md).
#ifndef T5LIKE_KERNELS_COMMON_H_
#define T5LIKE_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define T5LIKE_X86 1
#endif

namespace t5like {

inline bool CpuSupported() {
#ifdef T5LIKE_X86
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

#ifdef T5LIKE_X86
__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (max-subtracted scores, -|x|), 8 lanes: Cephes' range reduction and degree-5
// polynomial (relative error ~1e-7, as std::exp's float); x below -87.3 gives 0.
__attribute__((target("avx2,fma"))) inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(lo, x);  // NaN stays NaN (the second operand is returned).
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#endif

// Runs body(i) for every i in [0, n), each once, on this thread and on helpers scheduled on
// XLA's pool; returns when all are done. The calling thread takes items too, so the work ends
// even if no helper starts; a helper that starts late finds no item left and never calls body
// (which therefore may point at this call's buffers).
template <typename Body>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, Body body) {
  struct Counters {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto work = [counters, n, body] {
    for (int64_t i; (i = counters->next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      body(i);
      counters->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n) - 1;
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([work] { work(); });
  work();
  while (counters->done.load(std::memory_order_acquire) < n) {
#ifdef T5LIKE_X86
    _mm_pause();
#endif
  }
}

}  // namespace t5like

#endif  // T5LIKE_KERNELS_COMMON_H_
