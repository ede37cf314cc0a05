#include "ddp/observe/crc32c.hpp"

#include <array>

namespace ddp::observe {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41, bit-reversed
constexpr uint32_t kMaskDelta = 0xA282EAD8u;   // TensorFlow's crc32c::Mask

// One byte at a time: an events file gets a few kilobytes per step, far below
// what even this simplest table form checks per second.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t masked_crc32c(const void* data, size_t n) { return mask_crc(crc32c(data, n)); }

}  // namespace ddp::observe
