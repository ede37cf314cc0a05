// ddp::first_non_finite: where a float buffer first holds a NaN or an
// infinity, in one pass the compiler vectorises (integer tests on the bits,
// OR-ed over a block; the exact element is looked for only in a bad block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp {

// Whether a float with these bits is a NaN or an infinity (every exponent
// bit set): the test first_non_finite and the GPU's check of the gradients
// (optim/kernels.hpp, Kernels::non_finite) make.
DDP_HOST_DEVICE constexpr bool non_finite_bits(uint32_t bits) { return (bits & 0x7f800000u) == 0x7f800000u; }

// Index of the first NaN or infinity in p[0, n), or n when every value is finite.
inline size_t first_non_finite(const float* p, size_t n) {
  constexpr size_t kBlock = 1024;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof bits);
      bad |= uint32_t(non_finite_bits(bits));
    }
    if (!bad) continue;
    for (size_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof bits);
      if (non_finite_bits(bits)) return i;
    }
  }
  return n;
}

}  // namespace ddp
