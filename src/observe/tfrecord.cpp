#include "ddp/observe/tfrecord.hpp"

#include <cstdint>

#include "ddp/observe/crc32c.hpp"

namespace ddp::observe {

namespace {

// Byte by byte, so the file is little-endian whatever the host is.
template <typename T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

}  // namespace

void append_tfrecord(std::string& out, const std::string& data) {
  const size_t header_at = out.size();
  put_le<uint64_t>(out, data.size());
  put_le<uint32_t>(out, masked_crc32c(out.data() + header_at, sizeof(uint64_t)));
  out += data;
  put_le<uint32_t>(out, masked_crc32c(data.data(), data.size()));
}

}  // namespace ddp::observe
