// A TFRecord reader for the tests, written from the format's description
// (not from our writer): it checks both masked CRCs of every record and that
// the file ends on a record boundary.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ddp/observe/crc32c.hpp"

namespace ddp::observe::test {

inline uint64_t get_le(const std::string& s, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i) v |= uint64_t(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

// The records' data, in order; a failed check is a test failure and ends the read.
inline std::vector<std::string> read_tfrecords(const std::string& bytes) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) {
      ADD_FAILURE() << "a record header cut short at byte " << at;
      break;
    }
    const uint64_t length = get_le(bytes, at, 8);
    if (get_le(bytes, at + 8, 4) != masked_crc32c(bytes.data() + at, 8)) {
      ADD_FAILURE() << "bad length CRC at byte " << at;
      break;
    }
    if (bytes.size() - at - 12 < length + 4) {
      ADD_FAILURE() << "a record of " << length << " bytes cut short at byte " << at;
      break;
    }
    std::string data = bytes.substr(at + 12, length);
    if (get_le(bytes, at + 12 + length, 4) != masked_crc32c(data.data(), data.size())) {
      ADD_FAILURE() << "bad data CRC at byte " << at;
      break;
    }
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace ddp::observe::test
