// The fused conv -> relu -> avgpool2 op: against the three unfused ops, against
// finite differences, across thread counts, and its float layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/conv_engine.hpp"  // conv_chunk_images
#include "ddp/nn/cpu/ops.hpp"
#include "cpu_model.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn::cpu {
// gtest prints parameters through PrintTo found by argument-dependent lookup.
void PrintTo(const ConvGeom& g, std::ostream* os) {
  *os << "batch " << g.batch << " in " << g.in_c << "x" << g.in_h << "x" << g.in_w << " out_c "
      << g.out_c << " k " << g.k << " pad " << g.pad;
}
}  // namespace ddp::nn::cpu

namespace ddp::nn {
namespace {

using cpu::ConvGeom;
using test::conv_geom;
using test::max_rel_err;
using test::random_vec;

struct Sizes {
  size_t x, conv, pooled, w;
};
Sizes sizes(const ConvGeom& g) {
  const size_t planes = size_t(g.batch) * g.out_c;
  return {size_t(g.batch) * g.in_c * g.in_h * g.in_w, planes * g.out_h() * g.out_w(),
          planes * (g.out_h() / 2) * (g.out_w() / 2), size_t(g.out_c) * g.in_c * g.k * g.k};
}

// The unfused chain: conv2d, relu, avgpool2, and its backward.
struct Unfused {
  std::vector<double> y, dx, dw, db;
};
Unfused unfused(const ConvGeom& g, const std::vector<double>& x, const std::vector<double>& w,
                const std::vector<double>& b, const std::vector<double>& dy) {
  const Sizes n = sizes(g);
  cpu::ConvScratch<double> s;
  std::vector<double> conv(n.conv), act(n.conv), dact(n.conv), dconv(n.conv);
  Unfused u{std::vector<double>(n.pooled), std::vector<double>(n.x), std::vector<double>(n.w, 0.0),
            std::vector<double>(size_t(g.out_c), 0.0)};
  const int planes = g.batch * g.out_c;
  cpu::conv2d_forward(g, x.data(), w.data(), b.data(), conv.data(), s);
  cpu::relu_forward(int64_t(n.conv), conv.data(), act.data());
  cpu::avgpool2_forward(planes, g.out_h(), g.out_w(), act.data(), u.y.data());
  cpu::avgpool2_backward(planes, g.out_h(), g.out_w(), dy.data(), dact.data());
  cpu::relu_backward(int64_t(n.conv), act.data(), dact.data(), dconv.data());
  cpu::conv2d_backward(g, x.data(), w.data(), dconv.data(), u.dw.data(), u.db.data(), u.dx.data(), s);
  return u;
}

class Fused : public ::testing::TestWithParam<ConvGeom> {};

TEST_P(Fused, MatchesUnfusedChain) {
  const ConvGeom g = GetParam();
  const Sizes n = sizes(g);
  const auto x = random_vec(n.x, 1), w = random_vec(n.w, 2), b = random_vec(size_t(g.out_c), 3),
             dy = random_vec(n.pooled, 4);
  const Unfused want = unfused(g, x, w, b, dy);

  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    cpu::ConvScratch<double> s;
    std::vector<uint8_t> mask(size_t(cpu::conv_relu_mask_bytes(g)));
    // y with room after it: short pooled rows are stored as whole vectors
    // (Note [whole-vector rows] in core/simd.hpp), never past the batch.
    std::vector<double> y_room(n.pooled + 40, -7.0);
    std::vector<double> dx(n.x, 99.0), dw(n.w, 0.0), db(size_t(g.out_c), 0.0);
    cpu::conv2d_relu_avgpool2_forward(g, x.data(), w.data(), b.data(), y_room.data(), mask.data(), s, &pool);
    cpu::conv2d_relu_avgpool2_backward(g, x.data(), w.data(), mask.data(), dy.data(), dw.data(), db.data(),
                                       dx.data(), s, &pool);
    const std::vector<double> y(y_room.begin(), y_room.begin() + long(n.pooled));
    for (size_t j = n.pooled; j < y_room.size(); ++j) ASSERT_EQ(y_room[j], -7.0) << "past y, " << j;
    EXPECT_LT(max_rel_err(y, want.y), 1e-10) << threads << " threads";
    EXPECT_LT(max_rel_err(dx, want.dx), 1e-10) << threads << " threads";
    EXPECT_LT(max_rel_err(dw, want.dw), 1e-10) << threads << " threads";
    EXPECT_LT(max_rel_err(db, want.db), 1e-10) << threads << " threads";
    // Without dx (a first layer): the parameter gradients alone, which
    // layers without padding and with few taps compute on a path of their
    // own (Note [flat convolution] in conv_relu_pool.cpp).
    std::vector<double> dw1(n.w, 0.0), db1(size_t(g.out_c), 0.0);
    cpu::conv2d_relu_avgpool2_backward(g, x.data(), w.data(), mask.data(), dy.data(), dw1.data(), db1.data(),
                                       static_cast<double*>(nullptr), s, &pool);
    EXPECT_LT(max_rel_err(dw1, want.dw), 1e-10) << threads << " threads, no dx";
    EXPECT_LT(max_rel_err(db1, want.db), 1e-10) << threads << " threads, no dx";
  }
}

// L = <r, pool(relu(conv(x)))>; inputs are scaled so no pre-activation sits
// within a finite-difference step of the relu kink.
TEST_P(Fused, BackwardMatchesFiniteDifferences) {
  const ConvGeom g = GetParam();
  const Sizes n = sizes(g);
  auto x = random_vec(n.x, 5), w = random_vec(n.w, 6), b = random_vec(size_t(g.out_c), 7);
  const auto r = random_vec(n.pooled, 8);
  cpu::ConvScratch<double> s;
  std::vector<uint8_t> mask(size_t(cpu::conv_relu_mask_bytes(g)));
  std::vector<double> y(n.pooled);
  auto loss = [&] {
    cpu::conv2d_relu_avgpool2_forward(g, x.data(), w.data(), b.data(), y.data(), mask.data(), s);
    return test::dot(r, y);
  };
  loss();
  std::vector<double> dx(n.x), dw(n.w, 0.0), db(size_t(g.out_c), 0.0);
  cpu::conv2d_relu_avgpool2_backward(g, x.data(), w.data(), mask.data(), r.data(), dw.data(), db.data(),
                                     dx.data(), s);
  EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss)), 1e-5) << "dx";
  EXPECT_LT(max_rel_err(dw, test::numeric_grad(w, loss)), 1e-5) << "dw";
  EXPECT_LT(max_rel_err(db, test::numeric_grad(b, loss)), 1e-5) << "db";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fused,
                         ::testing::Values(conv_geom(2, 1, 8, 8, 3, 3),       // conv1's form, even 6x6
                                           conv_geom(2, 3, 9, 9, 4, 5),       // conv2's form, C > 1
                                           conv_geom(2, 2, 8, 9, 3, 3, 1, 1),  // odd width, padding
                                           conv_geom(1, 1, 7, 20, 2, 3),      // odd height, wide rows
                                           conv_geom(3, 2, 5, 40, 2, 3),      // rows over 2 vectors
                                           conv_geom(2, 2, 9, 11, 3, 2),      // 8 taps, odd width
                                           conv_geom(1, 1, 10, 13, 9, 4)));   // 16 taps, odd height

TEST(Fused, ManyChunksAndThreadsMatchUnfused) {
  // LeNet conv2: chunks of 13 images (kConvMinColumns over 81 pixels), four
  // chunks, two on each thread.
  const ConvGeom g = conv_geom(40, 20, 13, 13, 50, 5);
  ASSERT_EQ(cpu::conv_chunk_images<double>(g, 2), 13);
  const Sizes n = sizes(g);
  const auto x = random_vec(n.x, 9), w = random_vec(n.w, 10, 0.1),
             b = random_vec(size_t(g.out_c), 11), dy = random_vec(n.pooled, 12);
  const Unfused want = unfused(g, x, w, b, dy);
  ThreadPool pool(2);
  cpu::ConvScratch<double> s;
  std::vector<uint8_t> mask(size_t(cpu::conv_relu_mask_bytes(g)));
  std::vector<double> y(n.pooled), dx(n.x), dw(n.w, 0.0), db(size_t(g.out_c), 0.0);
  cpu::conv2d_relu_avgpool2_forward(g, x.data(), w.data(), b.data(), y.data(), mask.data(), s, &pool);
  cpu::conv2d_relu_avgpool2_backward(g, x.data(), w.data(), mask.data(), dy.data(), dw.data(), db.data(),
                                     dx.data(), s, &pool);
  EXPECT_LT(max_rel_err(y, want.y), 1e-10);
  EXPECT_LT(max_rel_err(dx, want.dx), 1e-10);
  EXPECT_LT(max_rel_err(dw, want.dw), 1e-10);
  EXPECT_LT(max_rel_err(db, want.db), 1e-10);
}

TEST(Fused, FloatLayerMatchesDoubleKernel) {
  const ConvGeom g = conv_geom(11, 1, 28, 28, 20, 3);  // LeNet conv1
  const Sizes n = sizes(g);
  const auto xd = random_vec(n.x, 13), wd = random_vec(n.w, 14, 0.3),
             bd = random_vec(20, 15, 0.1), dyd = random_vec(n.pooled, 16);
  cpu::ConvScratch<double> s;
  std::vector<uint8_t> mask(size_t(cpu::conv_relu_mask_bytes(g)));
  std::vector<double> yd(n.pooled), dwd(n.w, 0.0), dbd(20, 0.0);
  cpu::conv2d_relu_avgpool2_forward(g, xd.data(), wd.data(), bd.data(), yd.data(), mask.data(), s);
  cpu::conv2d_relu_avgpool2_backward(g, xd.data(), wd.data(), mask.data(), dyd.data(), dwd.data(),
                                     dbd.data(), static_cast<double*>(nullptr), s);

  GraphBuilder gb("m", {1, 28, 28}, false);
  const Graph graph = gb.finish(gb.conv_relu_pool("conv1", gb.input(), 20, 3));
  EXPECT_EQ(graph.output_shape(), (Shape{20, 13, 13}));
  const auto r = test::run_cpu_kernel(graph, 0, g.batch, {test::to_float(xd)}, {test::to_float(wd), test::to_float(bd)},
                                      test::to_float(dyd), /*threads=*/2);
  EXPECT_LT(test::scaled_err(r.y, yd), 1e-5);
  EXPECT_LT(test::scaled_err(r.dp[0], dwd), 1e-5);
  EXPECT_LT(test::scaled_err(r.dp[1], dbd), 1e-5);
}

}  // namespace
}  // namespace ddp::nn
