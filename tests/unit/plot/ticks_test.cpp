// Tick choice: 1, 2 or 5 times a power of ten apart, covering the data with
// about the intervals asked for, labelled with just enough decimals.
#include <gtest/gtest.h>

#include <cmath>

#include "ddp/plot/ticks.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

std::vector<std::string> labels(const Ticks& t) {
  std::vector<std::string> out;
  for (double v : t.values) out.push_back(t.label(v));
  return out;
}

bool nice(double step) {
  const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  return std::abs(m - 1) < 1e-9 || std::abs(m - 2) < 1e-9 || std::abs(m - 5) < 1e-9;
}

TEST(Ticks, LossRange) {
  const Ticks t = nice_ticks(0.45, 2.31, 5);
  EXPECT_EQ(labels(t), (std::vector<std::string>{"0.0", "0.5", "1.0", "1.5", "2.0", "2.5"}));
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 2.5);
}

TEST(Ticks, AccuracyRange) {
  EXPECT_EQ(labels(nice_ticks(0.1178, 0.7845, 5)),
            (std::vector<std::string>{"0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8"}));
}

TEST(Ticks, EpochsAreWholeNumbers) {
  EXPECT_EQ(labels(nice_ticks(1, 10, 5, 1)), (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
  EXPECT_EQ(labels(nice_ticks(1, 3, 5, 1)), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(labels(nice_ticks(1, 80, 5, 1)), (std::vector<std::string>{"0", "20", "40", "60", "80"}));
  // One epoch: a range around it, still whole numbers.
  EXPECT_EQ(labels(nice_ticks(1, 1, 5, 1)), (std::vector<std::string>{"0", "1", "2"}));
}

TEST(Ticks, BoundsOnATickAddNoEmptyInterval) {
  // 0.3 / 0.1 is 2.9999999999999996 in doubles.
  const Ticks t = nice_ticks(0.1, 0.3, 2);
  EXPECT_EQ(labels(t), (std::vector<std::string>{"0.1", "0.2", "0.3"}));
}

TEST(Ticks, RatesAndTinyRanges) {
  EXPECT_EQ(labels(nice_ticks(0, 11809.6, 5)),
            (std::vector<std::string>{"0", "2000", "4000", "6000", "8000", "10000", "12000"}));
  const Ticks tiny = nice_ticks(2.30190, 2.30276, 5);
  EXPECT_EQ(tiny.decimals, 4);
  EXPECT_EQ(tiny.label(tiny.lo), "2.3018");
}

TEST(Ticks, NegativeZeroIsZero) {
  const Ticks t = nice_ticks(-0.3, 0.3, 3);
  for (double v : t.values) EXPECT_NE(t.label(v), "-0.0");
  EXPECT_EQ(t.label(-1e-17), "0.0");
}

TEST(Ticks, PropertiesOverManyRanges) {
  for (double lo : {-7.3, -0.01, 0.0, 0.002, 1.0, 3.7, 512.0, 1e6}) {
    for (double span : {1e-4, 0.07, 1.0, 9.99, 1234.5}) {
      const double hi = lo + span;
      const Ticks t = nice_ticks(lo, hi, 5);
      // Covered up to float noise (a bound a rounding error past a tick does
      // not get an interval of its own).
      EXPECT_LE(t.lo, lo + 1e-6 * t.step) << lo << " " << hi;
      EXPECT_GE(t.hi, hi - 1e-6 * t.step) << lo << " " << hi;
      EXPECT_TRUE(nice(t.step)) << t.step;
      EXPECT_GE(t.values.size(), 3u) << lo << " " << hi;
      EXPECT_LE(t.values.size(), 12u) << lo << " " << hi;
      for (size_t i = 1; i < t.values.size(); ++i) EXPECT_NE(t.label(t.values[i]), t.label(t.values[i - 1]));
    }
  }
}

TEST(Ticks, NonFiniteIsAnError) {
  EXPECT_HAS(testing::error_of([] { nice_ticks(0, NAN); }), "is not finite");
  EXPECT_HAS(testing::error_of([] { nice_ticks(-INFINITY, 1); }), "is not finite");
}

}  // namespace
}  // namespace ddp::plot
