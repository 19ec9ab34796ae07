// Greedy decoding's argmax over a few rows of float32 logits, for XLA:CPU's decode step.
//
// XLA:CPU runs jnp.argmax as a variadic (value, index) reduce, one element at a time: 55-85 us a
// step over [8, 8192] logits, the largest of the step's small operations. Here a vector pass finds
// each row's maximum and a second pass its first position. Same result as jnp.argmax: the first
// index of the maximum, or of the first NaN where a row has one.
#include <cstdint>

#include "common.h"

namespace ffi = xla::ffi;

namespace {

#ifdef T5LIKE_X86
__attribute__((target("avx2,fma"))) int32_t RowArgmax(const float* x, int64_t n) {
  int64_t i = 0;
  __m256 max8 = _mm256_set1_ps(-INFINITY), nan8 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 xi = _mm256_loadu_ps(x + i);
    max8 = _mm256_max_ps(xi, max8);  // A NaN lane of xi keeps max8 (its second operand).
    nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(xi, xi, _CMP_UNORD_Q));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, max8);
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
  bool nan = _mm256_movemask_ps(nan8) != 0;
  for (int64_t j = i; j < n; ++j) {
    nan |= x[j] != x[j];
    best = x[j] > best ? x[j] : best;
  }
  if (nan) {  // Rare: the first NaN, one element at a time.
    for (int64_t j = 0; j < n; ++j)
      if (x[j] != x[j]) return static_cast<int32_t>(j);
  }
  const __m256 best8 = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), best8, _CMP_EQ_OQ));
    if (hits) return static_cast<int32_t>(i + __builtin_ctz(hits));
  }
  for (; i < n; ++i)
    if (x[i] == best) return static_cast<int32_t>(i);
  return 0;  // Empty rows (n == 0), as jnp.argmax's index 0.
}
#endif

ffi::Error ArgmaxImpl(ffi::Buffer<ffi::F32> x_bv, ffi::ResultBuffer<ffi::S32> out_b) {
#ifdef T5LIKE_X86
  if (!t5like::CpuSupported()) return ffi::Error::InvalidArgument("needs AVX2 and FMA");
  const auto dims = x_bv.dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument("argmax wants x [B, V]");
  const float* x = x_bv.typed_data();
  int32_t* out = out_b->typed_data();
  for (int64_t b = 0; b < dims[0]; ++b) out[b] = RowArgmax(x + b * dims[1], dims[1]);
  return ffi::Error::Success();
#else
  return ffi::Error::InvalidArgument("argmax is built for x86 only");
#endif
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(T5likeArgmax, ArgmaxImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [B, V]
                                  .Ret<ffi::Buffer<ffi::S32>>()  // argmax [B]
);

extern "C" int t5like_cpu_kernels_supported() { return t5like::CpuSupported() ? 1 : 0; }
