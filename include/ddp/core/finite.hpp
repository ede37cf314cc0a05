// ddp::first_non_finite: where a float buffer first holds a NaN or an
// infinity, in one pass the compiler vectorises (integer tests on the bits,
// OR-ed over a block; the exact element is looked for only in a bad block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ddp {

// Index of the first NaN or infinity in p[0, n), or n when every value is finite.
inline size_t first_non_finite(const float* p, size_t n) {
  constexpr size_t kBlock = 1024;
  constexpr uint32_t kExponent = 0x7f800000u;  // all exponent bits set: inf or NaN
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = b + kBlock < n ? b + kBlock : n;
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof bits);
      bad |= uint32_t((bits & kExponent) == kExponent);
    }
    if (!bad) continue;
    for (size_t i = b; i < e; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, sizeof bits);
      if ((bits & kExponent) == kExponent) return i;
    }
  }
  return n;
}

}  // namespace ddp
