// half.hpp, every value of both 16-bit formats: each converts to float and
// back to itself, and a float between two neighbours rounds to the nearer,
// ties to the even one, as IEEE round-to-nearest-even does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "ddp/core/half.hpp"

namespace ddp {
namespace {

struct Format {
  const char* name;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
  uint16_t inf;  // +infinity's bits
};

const Format kFp16{"fp16", fp16_to_float, float_to_fp16, 0x7c00};
const Format kBf16{"bf16", bf16_to_float, float_to_bf16, 0x7f80};

void every_value_round_trips(const Format& f) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float v = f.to_float(uint16_t(h));
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(f.to_float(f.from_float(v)))) << f.name << " NaN " << h;
      continue;
    }
    ASSERT_EQ(f.from_float(v), h) << f.name << " value " << v;
  }
}

// Positive finite neighbours a < b: their midpoint (exact in float) goes to
// the one with the even last bit, and one float step off it to the nearer.
void rounds_to_nearest_even(const Format& f) {
  for (uint32_t h = 0; h + 1 < f.inf; ++h) {
    const float a = f.to_float(uint16_t(h)), b = f.to_float(uint16_t(h + 1));
    const float mid = a + (b - a) / 2;
    ASSERT_TRUE(a < mid && mid < b) << f.name << " " << h;
    const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
    EXPECT_EQ(f.from_float(mid), even) << f.name << " midpoint of " << a << " and " << b;
    EXPECT_EQ(f.from_float(std::nextafter(mid, 0.0f)), h) << f.name << " below the midpoint of " << a;
    EXPECT_EQ(f.from_float(std::nextafter(mid, INFINITY)), h + 1) << f.name << " above the midpoint of " << a;
    EXPECT_EQ(f.from_float(-mid), uint16_t(even | 0x8000)) << f.name << " negative midpoint of " << a;
  }
}

TEST(Half, Fp16EveryValueRoundTrips) { every_value_round_trips(kFp16); }
TEST(Half, Bf16EveryValueRoundTrips) { every_value_round_trips(kBf16); }
TEST(Half, Fp16RoundsToNearestEven) { rounds_to_nearest_even(kFp16); }
TEST(Half, Bf16RoundsToNearestEven) { rounds_to_nearest_even(kBf16); }

TEST(Half, Fp16RangeEnds) {
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);  // the largest finite half
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);     // the midpoint, odd below: infinity
  EXPECT_EQ(float_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e6f), 0xfc00);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -26)), 0x0000);  // below half of it: zero
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7c00);
}

}  // namespace
}  // namespace ddp
