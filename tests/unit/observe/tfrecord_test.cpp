// TFRecord framing: the bytes of one record, and many records read back.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>

#include "ddp/observe/tfrecord.hpp"
#include "tfrecord_reader.hpp"

namespace ddp::observe {
namespace {

TEST(TfRecord, OneRecordByteForByte) {
  std::string out = "x";  // appends: what was there stays
  append_tfrecord(out, "123456789");
  ASSERT_EQ(out.size(), 1u + 8 + 4 + 9 + 4);
  EXPECT_EQ(out.substr(0, 9), std::string("x\x09\0\0\0\0\0\0\0", 9));
  EXPECT_EQ(test::get_le(out, 9, 4), masked_crc32c(out.data() + 1, 8));
  EXPECT_EQ(out.substr(13, 9), "123456789");
  EXPECT_EQ(test::get_le(out, 22, 4), 0xC78AB0E5u);  // masked CRC of "123456789"
}

TEST(TfRecord, ManyRecordsReadBack) {
  std::string out;
  std::vector<std::string> written;
  for (int i = 0; i < 300; ++i) {
    // Empty, short, and lengths past one byte and two bytes of the header.
    std::string data(static_cast<size_t>(i * i), '\0');
    for (size_t k = 0; k < data.size(); ++k) data[k] = static_cast<char>((k * 131 + i) & 0xFF);
    append_tfrecord(out, data);
    written.push_back(data);
  }
  EXPECT_EQ(test::read_tfrecords(out), written);
}

TEST(TfRecord, ReaderSeesACorruptByte) {
  std::string out;
  append_tfrecord(out, "some event");
  out[15] ^= 0x01;
  EXPECT_NONFATAL_FAILURE(test::read_tfrecords(out), "bad data CRC");
}

}  // namespace
}  // namespace ddp::observe
