// CRC-32C (Castagnoli), the checksum TFRecord framing uses. Debian packages no
// C++ CRC-32C library, and a table-driven one is a few lines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp::observe {

// CRC-32C of n bytes (reflected polynomial 0x82F63B78, initial value and final
// xor 0xFFFFFFFF): "123456789" gives 0xE3069283.
uint32_t crc32c(const void* data, size_t n);

// TFRecord stores masked CRCs, so that a CRC computed over bytes that
// themselves hold CRCs does not degenerate: rotate right by 15, add a constant.
uint32_t masked_crc32c(const void* data, size_t n);
uint32_t mask_crc(uint32_t crc);

}  // namespace ddp::observe
