// The units that timeout and failure messages are written in.
#include <gtest/gtest.h>

#include "ddp/comm/communicator.hpp"

namespace ddp::comm {
namespace {

TEST(Format, BytesAndDurations) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(size_t(25) << 20), "25.0 MiB");
  EXPECT_EQ(format_duration(std::chrono::milliseconds(250)), "250 ms");
  EXPECT_EQ(format_duration(std::chrono::seconds(300)), "300 s");
  EXPECT_EQ(format_duration(std::chrono::milliseconds(1500)), "1.5 s");
}

}  // namespace
}  // namespace ddp::comm
