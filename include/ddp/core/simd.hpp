// ddp::nn::simd: the few vector operations the CPU kernels need, behind one
// name for float and double, so that the double instantiation the tests check
// against finite differences runs the very code the float layers run.
//
// Masked loads and stores are the point: LeNet's rows are 9 to 28 elements
// wide, and a masked vector covers a short row in one instruction where a
// compiler-vectorised loop would fall into its scalar tail. Masked-off lanes
// are never accessed, so a mask may hang over the ends of a buffer.
//
// Two widths, one interface (a mask M has one bit a lane):
// - AVX-512 (DDP_NN_AVX512): 16 floats or 8 doubles a vector, the mask
//   registers themselves;
// - AVX2 with FMA: 8 floats a vector, and 8 doubles as a pair of 4, so that a
//   mask is one byte for both (the ReLU masks of conv_relu_pool.cpp store a
//   vector's mask as whole bytes); masked loads and stores are vmaskmov with
//   the bits widened to lanes, plain loads and stores where every bit is set.
// DDP_NN_SIMD is 1 when the build targets either (-march=native on such a
// machine) and 0 otherwise; callers keep a scalar path for the latter.
// DDP_NN_AVX512 guards the kernels written for AVX-512 alone (packed_gemm.cpp,
// fixed_point.hpp).
#pragma once

#include <cstdint>

#if defined(__AVX512F__)
#define DDP_NN_SIMD 1
#define DDP_NN_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define DDP_NN_SIMD 1
#define DDP_NN_AVX512 0
#else
#define DDP_NN_SIMD 0
#define DDP_NN_AVX512 0
#endif

#if DDP_NN_SIMD
// gcc 12 flags its own _mm512_undefined_* placeholders inside the intrinsic
// headers as uninitialised (-Wuninitialized); the warning's location is the
// header, so silencing it here silences only that.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#if DDP_NN_AVX512
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
  // A mask prepared once for many loads (AVX2 widens it to lanes).
  using MW = M;
  static MW wide(M m) { return m; }
  static V loadw(MW m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
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
  using MW = M;
  static MW wide(M m) { return m; }
  static V loadw(MW m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static void store(double* p, M m, V v) { _mm512_mask_storeu_pd(p, m, v); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
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

}  // namespace ddp::nn::simd
#elif DDP_NN_SIMD
namespace ddp::nn::simd {

// Bit j of m as all-ones or all-zeros in 32-bit lane j.
inline __m256i widen(uint8_t m) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), bit), bit);
}
// Bits 4h .. 4h+3 of m as all-ones or all-zeros in 64-bit lanes 0 .. 3.
inline __m256i widen64(uint8_t m, int h) {
  const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);
  return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(m >> (4 * h)), bit), bit);
}

template <typename T>
struct Vec;

template <>
struct Vec<float> {
  using V = __m256;
  using M = uint8_t;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V loadz(M m, const float* p) { return m == 0xff ? load(p) : _mm256_maskload_ps(p, widen(m)); }
  // A mask prepared once for many loads: widened to lanes.
  using MW = __m256i;
  static MW wide(M m) { return widen(m); }
  static V loadw(MW m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store(float* p, M m, V v) {
    if (m == 0xff)
      store(p, v);
    else
      _mm256_maskstore_ps(p, widen(m), v);
  }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }  // a*b + c
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V keep(M m, V v) { return _mm256_and_ps(_mm256_castsi256_ps(widen(m)), v); }
  static M positive(V v) { return M(_mm256_movemask_ps(_mm256_cmp_ps(v, zero(), _CMP_GT_OQ))); }
  static float sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  // Lane j: a[2j] + a[2j+1] over the 2L lanes of (lo, hi). hadd gives
  // lo's pairs 0-1, hi's 0-1, lo's 2-3, hi's 2-3 by 128-bit half.
  static V pair_sum(V lo, V hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_hadd_ps(lo, hi)), 0xD8));
  }
  // Lane j: v[j / 2].
  static V dup_pairs(V v) { return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)); }
};

// Eight doubles as two AVX2 vectors: lanes 0-3 in a, 4-7 in b.
struct Double8 {
  __m256d a, b;
};

template <>
struct Vec<double> {
  using V = Double8;
  using M = uint8_t;
  static constexpr int kLanes = 8;
  static V zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static V set1(double x) { return {_mm256_set1_pd(x), _mm256_set1_pd(x)}; }
  static V load(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
  static V loadz(M m, const double* p) {
    if (m == 0xff) return load(p);
    return {_mm256_maskload_pd(p, widen64(m, 0)), _mm256_maskload_pd(p + 4, widen64(m, 1))};
  }
  struct MW {
    __m256i a, b;
  };
  static MW wide(M m) { return {widen64(m, 0), widen64(m, 1)}; }
  static V loadw(const MW& m, const double* p) { return {_mm256_maskload_pd(p, m.a), _mm256_maskload_pd(p + 4, m.b)}; }
  static void store(double* p, V v) {
    _mm256_storeu_pd(p, v.a);
    _mm256_storeu_pd(p + 4, v.b);
  }
  static void store(double* p, M m, V v) {
    if (m == 0xff) return store(p, v);
    _mm256_maskstore_pd(p, widen64(m, 0), v.a);
    _mm256_maskstore_pd(p + 4, widen64(m, 1), v.b);
  }
  static V add(V x, V y) { return {_mm256_add_pd(x.a, y.a), _mm256_add_pd(x.b, y.b)}; }
  static V mul(V x, V y) { return {_mm256_mul_pd(x.a, y.a), _mm256_mul_pd(x.b, y.b)}; }
  static V fma(V x, V y, V z) { return {_mm256_fmadd_pd(x.a, y.a, z.a), _mm256_fmadd_pd(x.b, y.b, z.b)}; }
  static V max(V x, V y) { return {_mm256_max_pd(x.a, y.a), _mm256_max_pd(x.b, y.b)}; }
  static V keep(M m, V v) {
    return {_mm256_and_pd(_mm256_castsi256_pd(widen64(m, 0)), v.a),
            _mm256_and_pd(_mm256_castsi256_pd(widen64(m, 1)), v.b)};
  }
  static M positive(V v) {
    const int lo = _mm256_movemask_pd(_mm256_cmp_pd(v.a, _mm256_setzero_pd(), _CMP_GT_OQ));
    const int hi = _mm256_movemask_pd(_mm256_cmp_pd(v.b, _mm256_setzero_pd(), _CMP_GT_OQ));
    return M(lo | hi << 4);
  }
  static double sum(V v) {
    const __m256d s4 = _mm256_add_pd(v.a, v.b);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
  // hadd of (a, b) gives pairs 0-1, 4-5 | 2-3, 6-7 of the 8 lanes a, b hold.
  static __m256d pairs(__m256d a, __m256d b) { return _mm256_permute4x64_pd(_mm256_hadd_pd(a, b), 0xD8); }
  static V pair_sum(V lo, V hi) { return {pairs(lo.a, lo.b), pairs(hi.a, hi.b)}; }
  static V dup_pairs(V v) { return {_mm256_permute4x64_pd(v.a, 0x50), _mm256_permute4x64_pd(v.a, 0xFA)}; }
};

}  // namespace ddp::nn::simd
#endif

#if DDP_NN_SIMD
namespace ddp::nn::simd {

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

// Note [whole-vector rows]: the short rows a kernel writes often lie back to
// back in one run (an im2col row holds a chunk's output rows one after
// another; a chunk's dx planes, its pooled planes likewise). A row's last
// vector is then stored whole: its lanes past the row land on the rows after
// it, which are written later (the rows go in address order) and overwrite
// them. Only a vector that would reach past the run's end stores just its
// lanes m: past the run lies data that is not the kernel's (another row of
// the buffer, another thread's chunk). On AMD CPUs an AVX2 masked store
// (vmaskmov) costs about as much as a dozen plain ones.
template <typename T>
inline void store_within(T* p, const T* end, typename Vec<T>::M m, typename Vec<T>::V v) {
  if (p + Vec<T>::kLanes <= end)
    Vec<T>::store(p, v);
  else
    Vec<T>::store(p, m, v);
}

}  // namespace ddp::nn::simd
#endif
