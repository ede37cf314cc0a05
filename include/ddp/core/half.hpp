// IEEE half (fp16) and bfloat16 from and to float, rounding to nearest even
// as the hardware conversions do (CUDA's __float2half_rn, PyTorch's
// .to(torch.float16 / torch.bfloat16)): what gradients travel as under
// --grad-compression. Host-callable, so the tests check every one of the
// 65536 values of each format on any machine.
#pragma once

#include <cstdint>
#include <cstring>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp {

DDP_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

DDP_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

DDP_HOST_DEVICE inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// The upper 16 bits, rounded to nearest even on the lower 16; NaN stays a
// (quiet) NaN.
DDP_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DDP_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = float(mant) * bits_float(0x33800000u);
    return bits_float(sign | float_bits(v));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even; beyond half's range (>= 65520 in magnitude) an
// infinity of the same sign; NaN a quiet NaN.
DDP_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x47800000u)  // 2^16 and up, inf, NaN
    return uint16_t(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a < 0x38800000u) {
    // Below half's smallest normal (2^-14): adding 0.5 puts the subnormal's
    // bits at the bottom of the float's mantissa, and the float addition
    // itself rounds to nearest even.
    return uint16_t(sign | (float_bits(bits_float(a) + 0.5f) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 bits dropped,
  // ties to the even mantissa; a carry rounds up into the exponent (65520
  // and up become infinity).
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;
  return uint16_t(sign | (a >> 13));
}

}  // namespace ddp
