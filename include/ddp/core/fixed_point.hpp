// --deterministic's per-element arithmetic (Note [fixed-point gradients] in
// deterministic/exact_sum.hpp), written once for both sides: the host's quantize_add and
// the GPU's kernels (src/deterministic/exact_sum_cuda.cu) call these very functions, so
// the unit tests check on any machine what a GPU rank computes per element.
#pragma once

#include <math.h>  // fabs, rint on both sides (::rint(double) under nvcc too)

#include <cstddef>
#include <cstdint>
#include <limits>

#include "ddp/core/half.hpp"         // float_bits
#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE
#if !defined(__CUDACC__)
#include "ddp/core/simd.hpp"  // the AVX-512 intrinsics, where the build has them
#endif

namespace ddp::fixed_point {

// g * scale (scale a power of two: exact) rounded to the nearest integer,
// ties to even, into *out, when it lies below limit in magnitude; false (and
// nothing written) otherwise, a NaN included. rint rounds ties to even on the
// device and, in the default rounding mode, on the host.
DDP_HOST_DEVICE inline bool to_fixed(float g, double scale, double limit, int64_t* out) {
  const double v = double(g) * scale;
  if (!(fabs(v) < limit)) return false;
  *out = static_cast<int64_t>(rint(v));
  return true;
}

// An integer sum back to a float: acc * inv_scale (a power of two), rounded
// once.
DDP_HOST_DEVICE inline float from_fixed(int64_t acc, double inv_scale) {
  return static_cast<float>(double(acc) * inv_scale);
}

// The bits of |g| as an unsigned integer, +infinity's for a NaN or an
// infinity: for non-negative floats the bits order as the values do, so the
// largest |g| of a tensor is an integer maximum (atomicMax on the GPU).
DDP_HOST_DEVICE inline uint32_t magnitude_bits(float g) {
  const uint32_t u = float_bits(g) & 0x7fffffffu;
  return u >= 0x7f800000u ? 0x7f800000u : u;
}

// A batch's loss sum rounded to a multiple of 2^-20: sums of such values
// (below 2^32 in magnitude) are exact in double, so they come out the same
// in any order (the trainer adds every rank's).
DDP_HOST_DEVICE inline double round_loss_sum(double s) { return rint(s * 1048576.0) * (1.0 / 1048576.0); }

// Where a parameter's fixed-point sums live on the host, for a kernel that
// quantizes the gradients it computes itself (Note [fixed-point epilogue] in
// nn/cpu/packed_gemm.hpp): element i's integer at acc[i], converted at 2^exponent
// and kept below 2^limit_bits, and the largest |g| seen so far in *max
// (+infinity once one was a NaN or an infinity).
struct Sink {
  int64_t* acc = nullptr;
  int exponent = 0;
  int limit_bits = 0;
  double* max = nullptr;
};

#if !defined(__CUDACC__) && DDP_NN_AVX512 && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define DDP_FIXED_POINT_SIMD 1
// to_fixed eight elements at a time, element by element the same: the scaled
// double's magnitude below limit (false for NaN), vcvtpd2qq rounding as rint
// does (to nearest even, MXCSR's default). One per tensor: it keeps the
// largest |g| it was given and whether all were finite.
class Quantizer8 {
 public:
  Quantizer8(int exponent, int limit_bits)
      : scale_(_mm512_set1_pd(ldexp(1.0, exponent))), limit_(_mm512_set1_pd(ldexp(1.0, limit_bits))) {}
  // acc[i] += to_fixed(x[i]) for the lanes i in `lanes` (the others are
  // neither read nor written, nor counted in the maximum).
  void add(__m256 x, int64_t* acc, __mmask8 lanes = 0xff) {
    const __m256 a = _mm256_maskz_mov_ps(lanes, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x));
    finite_ &= _mm256_cmp_ps_mask(a, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ);
    max_ = _mm256_max_ps(a, max_);  // max_ where a is NaN; finite_ has it
    const __m512d v = _mm512_mul_pd(_mm512_cvtps_pd(x), scale_);
    const __mmask8 fits = lanes & _mm512_cmp_pd_mask(_mm512_abs_pd(v), limit_, _CMP_LT_OQ);
    const __m512i q = _mm512_cvtpd_epi64(v);
    _mm512_mask_storeu_epi64(acc, fits, _mm512_add_epi64(_mm512_maskz_loadu_epi64(fits, acc), q));
  }
  // The largest |x| given, or +infinity when one was a NaN or an infinity.
  double max() const {
    if (finite_ != 0xff) return std::numeric_limits<double>::infinity();
    alignas(32) float m[8];
    _mm256_store_ps(m, max_);
    float r = 0;
    for (float v : m) r = r > v ? r : v;
    return double(r);
  }

 private:
  __m512d scale_, limit_;
  __m256 max_ = _mm256_setzero_ps();
  __mmask8 finite_ = 0xff;
};
#else
#define DDP_FIXED_POINT_SIMD 0
#endif

#if !defined(__CUDACC__)
// acc[i] += to_fixed(g[i]) at 2^exponent, for the elements below
// 2^limit_bits after scaling (the others are left out: the step is redone).
// Returns the largest |g[i]|, or +infinity when one is NaN or infinite.
inline double quantize_add(const float* g, size_t n, int exponent, int limit_bits, int64_t* acc) {
  size_t i = 0;
  double max = 0;
#if DDP_FIXED_POINT_SIMD
  // Every micro-shard's every gradient passes here: 4% of a ResNet-18
  // --deterministic run when it was the scalar loop below.
  Quantizer8 q(exponent, limit_bits);
  for (; i + 8 <= n; i += 8) q.add(_mm256_loadu_ps(g + i), acc + i);
  max = q.max();
#endif
  const double scale = ldexp(1.0, exponent), limit = ldexp(1.0, limit_bits);
  for (; i < n; ++i) {
    const float a = fabsf(g[i]);
    if (!(a <= std::numeric_limits<float>::max())) max = std::numeric_limits<double>::infinity();
    if (double(a) > max) max = double(a);
    int64_t q;
    if (to_fixed(g[i], scale, limit, &q)) acc[i] += q;
  }
  return max;
}

// quantize_add into a Sink, its maximum updated.
inline void quantize_add(const float* g, size_t n, const Sink& s) {
  const double m = quantize_add(g, n, s.exponent, s.limit_bits, s.acc);
  if (m > *s.max) *s.max = m;
}
#endif

}  // namespace ddp::fixed_point
