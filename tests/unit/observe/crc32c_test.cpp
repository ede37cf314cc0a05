// CRC-32C against published vectors: RFC 3720 (iSCSI) appendix B.4 and the
// check value of the CRC catalogue; masking as TensorFlow's crc32c::Mask.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/observe/crc32c.hpp"

namespace ddp::observe {
namespace {

uint32_t crc_of(const std::vector<uint8_t>& bytes) { return crc32c(bytes.data(), bytes.size()); }

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c("a", 1), 0xC1D04330u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc_of(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc_of(ones), 0x62A8AB43u);
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
  // An iSCSI read command PDU.
  const std::vector<uint8_t> read_pdu = {
      0x01, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
      0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc_of(read_pdu), 0xD9963A56u);
}

TEST(Crc32c, MaskedAsTfRecordStoresIt) {
  // Every TensorFlow events file opens with the length 24 (the file-version
  // record) and these four bytes: a3 7f 4b 22.
  const uint8_t length24[8] = {0x18, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(masked_crc32c(length24, 8), 0x224B7FA3u);
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc(0), 0xA282EAD8u);
  // Masking is a rotation plus a constant: no two CRCs share a mask.
  EXPECT_NE(mask_crc(0x12345678u), mask_crc(0x12345679u));
}

}  // namespace
}  // namespace ddp::observe
