// Note [channels last] (nn/layout.hpp): which graphs run NHWC on a GPU, and
// the host-checkable arithmetic of the NHWC kernels: their indices, the
// global pool's order, the KRSC weight copies, the runs of Note [channels
// last sums] and the convolution's graph tensors and cache key.
#include "ddp/nn/layout.hpp"

#include <gtest/gtest.h>

#include <array>
#include <set>
#include <string>
#include <vector>

#include "ddp/nn/cuda/bn_plan.hpp"    // plan_nhwc_split, max_sum_runs
#include "ddp/nn/cuda/conv_algo.hpp"  // conv_graph_shapes, conv_plan_key
#include "ddp/nn/graph.hpp"
#include "ddp/nn/kernel_math.hpp"
#include "grad_check.hpp"
#include "layout_util.hpp"  // to_layout

namespace ddp::nn {
namespace {

using test::random_vec;
using test::to_float;

TEST(ChannelsLast, Resnet18RunsNhwcWhenAsked) {
  const Graph g = model_graph("resnet18", {1, 28, 28}, 10);
  EXPECT_EQ(plan_layout(g, false).layout, Layout::NCHW);
  EXPECT_EQ(plan_layout(g, false).why, "") << "nothing asked, nothing refused";
  const LayoutPlan plan = plan_layout(g, true);
  EXPECT_EQ(plan.layout, Layout::NHWC) << plan.why;
  EXPECT_EQ(plan.why, "");
  for (const Op& op : g.ops) EXPECT_TRUE(runs_nhwc(g, op)) << op.name;
}

TEST(ChannelsLast, LenetStaysNchwNamingItsFirstOpWithoutAnNhwcKernel) {
  const Graph g = model_graph("lenet", {1, 28, 28}, 10);
  const LayoutPlan plan = plan_layout(g, true);
  EXPECT_EQ(plan.layout, Layout::NCHW);
  EXPECT_NE(plan.why.find("ConvReluPool"), std::string::npos) << plan.why;
  EXPECT_NE(plan.why.find(g.ops[0].name), std::string::npos) << plan.why;
}

TEST(ChannelsLast, FlattenOfAPlaneAndPoolingNeedNchw) {
  // conv -> flatten of 4x6x6: the state dict's order is NCHW's.
  GraphBuilder b("flat", {1, 8, 8}, true);
  const Graph flat = b.finish(b.linear("fc", b.flatten("flatten", b.conv("conv", b.input(), 4, 3)), 2));
  EXPECT_EQ(plan_layout(flat, true).layout, Layout::NCHW);
  EXPECT_NE(plan_layout(flat, true).why.find("op flatten (Flatten)"), std::string::npos) << plan_layout(flat, true).why;
  GraphBuilder p("pool", {1, 8, 8}, true);
  const Graph pool = p.finish(p.flatten("flatten", p.global_avg_pool("gap", p.avg_pool2("pool", p.conv("conv", 0, 4, 3)))));
  EXPECT_NE(plan_layout(pool, true).why.find("op pool (AvgPool2d)"), std::string::npos) << plan_layout(pool, true).why;
  // After the global pool a value is one pixel: the same bytes in both layouts.
  GraphBuilder r("gap", {1, 8, 8}, true);
  const Graph gap = r.finish(r.linear("fc", r.flatten("flatten", r.global_avg_pool("gap", r.conv("conv", 0, 4, 3))), 2));
  EXPECT_EQ(plan_layout(gap, true).layout, Layout::NHWC) << plan_layout(gap, true).why;
}

TEST(ChannelsLast, AnInputOfSeveralChannelsStaysNchw) {
  GraphBuilder b("rgb", {3, 8, 8}, true);
  const Graph g = b.finish(b.flatten("flatten", b.global_avg_pool("gap", b.conv("conv", 0, 4, 3))));
  const LayoutPlan plan = plan_layout(g, true);
  EXPECT_EQ(plan.layout, Layout::NCHW);
  EXPECT_NE(plan.why.find("input 3x8x8"), std::string::npos) << plan.why;
}

// The loss reads the output as NCHW: a graph whose output is a plane
// (here a convolution's) stays NCHW, though each of its ops has an NHWC
// kernel.
TEST(ChannelsLast, AnOutputOfPlanesStaysNchw) {
  GraphBuilder b("planes", {1, 8, 8}, true);
  const Graph g = b.finish(b.conv("conv", 0, 4, 3));
  for (const Op& op : g.ops) EXPECT_TRUE(runs_nhwc(g, op)) << op.name;
  const LayoutPlan plan = plan_layout(g, true);
  EXPECT_EQ(plan.layout, Layout::NCHW);
  EXPECT_NE(plan.why.find("output 4x"), std::string::npos) << plan.why;
}

TEST(ChannelsLast, IndicesAreATransposeOfOneAnother) {
  const int n = 2, c = 3, h = 4, w = 5;
  std::set<int64_t> nchw, nhwc;
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          nchw.insert(nchw_at(i, ch, y, x, c, h, w));
          nhwc.insert(nhwc_at(i, ch, y, x, c, h, w));
          EXPECT_EQ(nhwc_at(i, ch, y, x, c, h, w) % c, ch) << "channel innermost";
        }
  EXPECT_EQ(nchw.size(), size_t(n * c * h * w));
  EXPECT_EQ(nhwc, nchw) << "both are bijections onto [0, n c h w)";
  EXPECT_EQ(*nhwc.rbegin(), int64_t(n * c * h * w - 1));
}

// The NHWC batch of an NCHW one of n samples of c x h x w.
std::vector<float> to_nhwc(const std::vector<float>& x, int n, int c, int h, int w) {
  return test::to_layout(x, n, {c, h, w}, Layout::NHWC);
}

TEST(ChannelsLast, GlobalPoolGivesTheSameBitsInBothLayouts) {
  const int n = 3, c = 5, h = 4, w = 3, hw = h * w;
  const auto x = to_float(random_vec(size_t(n * c * hw), 61)), dy = to_float(random_vec(size_t(n * c), 62));
  const auto xt = to_nhwc(x, n, c, h, w);
  std::vector<float> dx(x.size()), dxt(x.size());
  for (int64_t i = 0; i < n * c; ++i)
    EXPECT_EQ(kernel::global_avgpool_nhwc_at(i, c, hw, xt.data()), kernel::global_avgpool_at(i, hw, x.data())) << i;
  for (size_t i = 0; i < x.size(); ++i) {
    dx[i] = kernel::global_avgpool_grad_at(int64_t(i), hw, dy.data());
    dxt[i] = kernel::global_avgpool_grad_nhwc_at(int64_t(i), c, hw, dy.data());
  }
  EXPECT_EQ(dxt, to_nhwc(dx, n, c, h, w));
}

TEST(ChannelsLast, KrscCopyOfTheWeights) {
  // KRSC is the NHWC of [k, c, r, s] weights seen as k images of c channels.
  const int k = 4, c = 3, r = 3, s = 2;
  const auto w = to_float(random_vec(size_t(k * c * r * s), 63));
  const auto want = to_nhwc(w, k, c, r, s);
  std::vector<float> got(w.size());
  std::set<int64_t> from;
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t at = kernel::krsc_to_kcrs(int64_t(i), c, r * s);
    from.insert(at);
    got[i] = w[size_t(at)];
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(from.size(), w.size()) << "every weight once";
}

// Note [channels last sums]: every row in one run, none empty, never more
// runs than a layer allocates, and enough blocks to fill the GPU when the
// tensor is large.
TEST(ChannelsLast, SumRunsCoverEveryRowAndFitTheirBuffer) {
  for (int sms : {1, 16, 132})
    for (int c : {1, 3, 31, 64, 65, 512})
      for (int64_t rows : {int64_t(1), int64_t(63), int64_t(64), int64_t(5000), int64_t(256) * 28 * 28}) {
        SCOPED_TRACE(testing::Message() << sms << " SMs, " << c << " channels, " << rows << " rows");
        const BnSplit p = plan_nhwc_split(rows, c, sms);
        ASSERT_GE(p.splits, 1);
        EXPECT_GE(int64_t(p.splits) * p.per_split, rows);
        EXPECT_LT(int64_t(p.splits - 1) * p.per_split, rows) << "the last run would be empty";
        EXPECT_LE(p.splits, max_sum_runs(c, sms));
        EXPECT_GE(max_sum_runs(c, sms), max_bn_splits(c, sms)) << "NCHW's runs fit the same buffer";
      }
  // ResNet-18's first BatchNorm at batch 256 (64 channels of 28x28, 2 groups
  // of 32) on 132 SMs: 8 blocks a SM (a run fewer where the rows do not
  // divide evenly).
  const BnSplit p = plan_nhwc_split(int64_t(256) * 28 * 28, 64, 132);
  EXPECT_EQ(max_bn_splits(nhwc_channel_groups(64), 132), 528);
  EXPECT_GE(p.splits, 527);
  EXPECT_EQ(plan_nhwc_split(10, 64, 132).splits, 1) << "a few rows in one block";
  EXPECT_EQ(nhwc_channel_groups(32), 1);
  EXPECT_EQ(nhwc_channel_groups(33), 2);
}

TEST(ChannelsLast, ConvolutionGraphTensorsAndKey) {
  const ConvGraphShapes s = conv_graph_shapes({64, 28, 28}, {128, 14, 14}, 3, 256, Layout::NHWC);
  EXPECT_EQ(s.x.dims, (std::array<int64_t, 4>{256, 64, 28, 28}));
  EXPECT_EQ(s.x.strides, (std::array<int64_t, 4>{28 * 28 * 64, 1, 28 * 64, 64}));
  EXPECT_EQ(s.w.dims, (std::array<int64_t, 4>{128, 64, 3, 3}));
  EXPECT_EQ(s.w.strides, (std::array<int64_t, 4>{9 * 64, 1, 3 * 64, 64})) << "KRSC";
  EXPECT_EQ(s.y.strides, (std::array<int64_t, 4>{14 * 14 * 128, 1, 14 * 128, 128}));
  const ConvGraphShapes n = conv_graph_shapes({64, 28, 28}, {128, 14, 14}, 3, 256);
  EXPECT_EQ(n.x.strides, (std::array<int64_t, 4>{64 * 28 * 28, 28 * 28, 28, 1}));
  // Timed choices are kept apart by layout; NCHW's keys are as before.
  const std::string nchw = conv_plan_key({64, 28, 28}, 128, 3, 2, 1, 256, Precision::BF16);
  EXPECT_EQ(nchw, "64x28x28 -> 128 k3 s2 p1, batch 256, bf16");
  EXPECT_EQ(conv_plan_key({64, 28, 28}, 128, 3, 2, 1, 256, Precision::BF16, Layout::NHWC), nchw + ", NHWC");
}

}  // namespace
}  // namespace ddp::nn
