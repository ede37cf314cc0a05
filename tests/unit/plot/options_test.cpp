// ddp_plot's flags: runs with labels, -o's prefix, and the combinations refused.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/plot/options.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

PlotOptions parse(std::vector<const char*> args) {
  args.insert(args.begin(), "ddp_plot");
  return parse_plot_options(static_cast<int>(args.size()), args.data());
}

std::string usage_error(std::vector<const char*> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(PlotOptions, RunsInOrderWithLabels) {
  const PlotOptions o = parse({"-o", "out/d2l", "runs/np1.jsonl", "four=runs/np4.jsonl", "--title", "T"});
  ASSERT_EQ(o.runs.size(), 2u);
  EXPECT_EQ(o.runs[0].label, "np1");
  EXPECT_EQ(o.runs[1].label, "four");
  EXPECT_EQ(o.runs[1].path, "runs/np4.jsonl");
  EXPECT_EQ(o.prefix, "out/d2l");
  EXPECT_EQ(o.title, "T");
  EXPECT_TRUE(o.png);
  EXPECT_DOUBLE_EQ(o.scale, 2);
}

TEST(PlotOptions, PrefixMayNameEitherFile) {
  EXPECT_EQ(parse({"-o", "d2l.png", "a.jsonl"}).prefix, "d2l");
  EXPECT_EQ(parse({"--output", "d2l.svg", "a.jsonl"}).prefix, "d2l");
}

TEST(PlotOptions, Bench) {
  const PlotOptions o = parse({"--bench", "b.jsonl", "-o", "bars", "--no-png"});
  EXPECT_EQ(o.bench, "b.jsonl");
  EXPECT_TRUE(o.runs.empty());
  EXPECT_FALSE(o.png);
}

TEST(PlotOptions, Refused) {
  EXPECT_HAS(usage_error({"-o", "x"}), "no metrics files given");
  EXPECT_HAS(usage_error({"a.jsonl"}), "-o PREFIX is required");
  EXPECT_HAS(usage_error({"-o", "x", "--bench", "b.jsonl", "a.jsonl"}), "--bench draws the benchmark's file alone");
  EXPECT_HAS(usage_error({"-o", "x", "--bench", "b.jsonl", "--train-acc"}), "--train-acc is for metrics files");
  EXPECT_HAS(usage_error({"-o", "x", "--scale", "0", "a.jsonl"}), "--scale 0 is out of range");
  EXPECT_HAS(usage_error({"-o", "x", "--frobnicate", "a.jsonl"}), "frobnicate");
  EXPECT_HAS(usage_error({"-o", "x", "a/m.jsonl", "b/m.jsonl"}),
             "two runs are labelled 'm' (a/m.jsonl and b/m.jsonl): name them with LABEL=PATH");
}

TEST(PlotOptions, Help) {
  const PlotOptions o = parse({"--help"});
  ASSERT_TRUE(o.help);
  EXPECT_HAS(*o.help, "--bench");
  EXPECT_HAS(*o.help, "LABEL");
}

}  // namespace
}  // namespace ddp::plot
