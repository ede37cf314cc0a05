// --deterministic's per-element arithmetic (Note [fixed-point gradients] in
// ddp/exact_sum.hpp), written once for both sides: the host's quantize_add and
// the GPU's kernels (src/ddp/exact_sum_cuda.cu) call these very functions, so
// the unit tests check on any machine what a GPU rank computes per element.
#pragma once

#include <math.h>  // fabs, rint on both sides (::rint(double) under nvcc too)

#include <cstdint>

#include "ddp/core/half.hpp"         // float_bits
#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

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

}  // namespace ddp::fixed_point
