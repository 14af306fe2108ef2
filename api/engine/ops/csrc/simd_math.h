/* Vector math shared by the ops of the library. AVX2 + FMA: callers compiled for a wider set
 * (AVX-512) inline it too. */
#ifndef TOKENSHOP_SIMD_MATH_H
#define TOKENSHOP_SIMD_MATH_H

#include <immintrin.h>

/* e^x for 8 floats (Cephes' expf: x = n ln 2 + r, a degree-6 polynomial in r, times 2^n), to
 * ~1e-7 relative; x is clamped to +-88.4, where float's e^x ends. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)),
                    _mm256_set1_ps(88.3762626647949f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                             _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i exponent = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  __m256i pow2 = _mm256_slli_epi32(exponent, 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
}

#endif
