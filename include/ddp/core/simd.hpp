// ddp::nn::simd: the few AVX-512 operations the CPU kernels need, behind one
// name for float and double, so that the double instantiation the tests check
// against finite differences runs the very code the float layers run.
//
// Masked loads and stores are the point: LeNet's rows are 9 to 28 elements
// wide, and a masked vector covers a short row in one instruction where a
// compiler-vectorised loop would fall into its scalar tail. Masked-off lanes
// are never accessed, so a mask may hang over the ends of a buffer.
//
// DDP_NN_SIMD is 1 when the build targets AVX-512 (-march=native on such a
// machine) and 0 otherwise; callers keep a scalar path for the latter.
#pragma once

#if defined(__AVX512F__)
#define DDP_NN_SIMD 1
// gcc 12 flags its own _mm512_undefined_* placeholders inside the intrinsic
// headers as uninitialised (-Wuninitialized); the warning's location is the
// header, so silencing it here silences only that.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define DDP_NN_SIMD 0
#endif

#if DDP_NN_SIMD
namespace ddp::nn::simd {

template <typename T>
struct Vec;

template <>
struct Vec<float> {
  using V = __m512;
  using M = __mmask16;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V loadz(M m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V keep(M m, V v) { return _mm512_maskz_mov_ps(m, v); }  // zero where m is clear
  static M positive(V v) { return _mm512_cmp_ps_mask(v, zero(), _CMP_GT_OQ); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  // Lane j: a[2j] + a[2j+1] over the 2L lanes of (lo, hi): 2:1 horizontal pooling.
  static V pair_sum(V lo, V hi) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_ps(_mm512_permutex2var_ps(lo, even, hi), _mm512_permutex2var_ps(lo, odd, hi));
  }
  // Lane j: v[j / 2]: the 1:2 upsampling that undoes pair_sum's shape.
  static V dup_pairs(V v) {
    const __m512i idx = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_permutexvar_ps(idx, v);
  }
};

template <>
struct Vec<double> {
  using V = __m512d;
  using M = __mmask8;
  static constexpr int kLanes = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V set1(double a) { return _mm512_set1_pd(a); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static V loadz(M m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static void store(double* p, M m, V v) { _mm512_mask_storeu_pd(p, m, v); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V max(V a, V b) { return _mm512_max_pd(a, b); }
  static V keep(M m, V v) { return _mm512_maskz_mov_pd(m, v); }
  static M positive(V v) { return _mm512_cmp_pd_mask(v, zero(), _CMP_GT_OQ); }
  static double sum(V v) { return _mm512_reduce_add_pd(v); }
  static V pair_sum(V lo, V hi) {
    const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_add_pd(_mm512_permutex2var_pd(lo, even, hi), _mm512_permutex2var_pd(lo, odd, hi));
  }
  static V dup_pairs(V v) {
    const __m512i idx = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
    return _mm512_permutexvar_pd(idx, v);
  }
};

// Lanes [lo, hi) set, clipped to the vector.
template <typename T>
inline typename Vec<T>::M lanes(int lo, int hi) {
  constexpr int n = Vec<T>::kLanes;
  lo = lo < 0 ? 0 : lo;
  hi = hi > n ? n : hi;
  if (hi <= lo) return 0;
  const unsigned all = (1u << n) - 1u;
  return static_cast<typename Vec<T>::M>((all >> (n - (hi - lo))) << lo);
}

}  // namespace ddp::nn::simd
#endif
