// avgpool2, relu, linear and softmax cross-entropy: backward against central
// finite differences in double, and the float layers against the double ops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "cpu_model.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using test::max_rel_err;
using test::random_vec;

TEST(AvgPool2, ForwardAveragesEachWindowAndDropsTheOddEdge) {
  // One 3x5 plane: the last row and column feed nothing (floor).
  const std::vector<double> x = {1, 2, 3, 4, 100,  //
                                 5, 6, 7, 8, 100,  //
                                 100, 100, 100, 100, 100};
  std::vector<double> y(2);
  cpu::avgpool2_forward(1, 3, 5, x.data(), y.data());
  EXPECT_DOUBLE_EQ(y[0], (1 + 2 + 5 + 6) / 4.0);
  EXPECT_DOUBLE_EQ(y[1], (3 + 4 + 7 + 8) / 4.0);
}

TEST(AvgPool2, BackwardMatchesFiniteDifferences) {
  for (auto [planes, h, w] : {std::tuple{3, 4, 6}, std::tuple{2, 5, 7}, std::tuple{1, 26, 26}}) {
    auto x = random_vec(size_t(planes) * h * w, 1);
    const auto r = random_vec(size_t(planes) * (h / 2) * (w / 2), 2);
    std::vector<double> y(r.size());
    auto loss = [&] {
      cpu::avgpool2_forward(planes, h, w, x.data(), y.data());
      return test::dot(r, y);
    };
    std::vector<double> dx(x.size(), 42.0);
    cpu::avgpool2_backward(planes, h, w, r.data(), dx.data());
    EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss)), 1e-6) << h << "x" << w;
  }
}

TEST(Relu, BackwardMatchesFiniteDifferences) {
  auto x = random_vec(200, 3);
  for (double& v : x)
    if (std::abs(v) < 1e-3) v = 0.5;  // keep finite differences off the kink
  const auto r = random_vec(x.size(), 4);
  std::vector<double> y(x.size());
  auto loss = [&] {
    cpu::relu_forward(int64_t(x.size()), x.data(), y.data());
    return test::dot(r, y);
  };
  loss();
  std::vector<double> dx(x.size());
  cpu::relu_backward(int64_t(x.size()), y.data(), r.data(), dx.data());
  EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss)), 1e-7);
  int zeros = 0;
  for (double v : y) zeros += v == 0.0;
  EXPECT_GT(zeros, 50) << "about half the outputs should be clamped";
}

TEST(Linear, ForwardIsXWTransposePlusBias) {
  // x = [1, 2], W = [[1, 0], [0, 1], [1, 1]] (out 3, in 2), b = [10, 20, 30].
  const std::vector<double> x = {1, 2}, w = {1, 0, 0, 1, 1, 1}, b = {10, 20, 30};
  std::vector<double> y(3);
  cpu::linear_forward(1, 2, 3, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(y, (std::vector<double>{11, 22, 33}));
}

TEST(Linear, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int batch = 3, in = 5, out = 4;
  auto x = random_vec(size_t(batch) * in, 5), w = random_vec(size_t(out) * in, 6),
       b = random_vec(size_t(out), 7);
  const auto r = random_vec(size_t(batch) * out, 8);
  std::vector<double> y(r.size());
  auto loss = [&] {
    cpu::linear_forward(batch, in, out, x.data(), w.data(), b.data(), y.data());
    return test::dot(r, y);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  cpu::linear_backward(batch, in, out, x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data());
  EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss)), 1e-7) << "dx";
  EXPECT_LT(max_rel_err(dw, test::numeric_grad(w, loss)), 1e-7) << "dw";
  EXPECT_LT(max_rel_err(db, test::numeric_grad(b, loss)), 1e-7) << "db";

  const auto dw1 = dw, db1 = db;
  cpu::linear_backward(batch, in, out, x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data());
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw[i], 2 * dw1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_DOUBLE_EQ(db[i], 2 * db1[i]);
}

TEST(Linear, ThreadsGiveTheSameResult) {
  const int batch = 70, in = 300, out = 37;  // a row and column block per thread, ragged
  const auto x = random_vec(size_t(batch) * in, 20), w = random_vec(size_t(out) * in, 21),
             b = random_vec(size_t(out), 22), dy = random_vec(size_t(batch) * out, 23);
  std::vector<double> y1(dy.size()), dx1(x.size()), dw1(w.size(), 1.0), db1(b.size(), 1.0);
  cpu::linear_forward(batch, in, out, x.data(), w.data(), b.data(), y1.data());
  cpu::linear_backward(batch, in, out, x.data(), w.data(), dy.data(), dw1.data(), db1.data(),
                       dx1.data());
  ThreadPool pool(3);
  std::vector<double> y3(dy.size()), dx3(x.size()), dw3(w.size(), 1.0), db3(b.size(), 1.0);
  cpu::linear_forward(batch, in, out, x.data(), w.data(), b.data(), y3.data(), &pool);
  cpu::linear_backward(batch, in, out, x.data(), w.data(), dy.data(), dw3.data(), db3.data(),
                       dx3.data(), &pool);
  EXPECT_LT(max_rel_err(y3, y1), 1e-12);
  EXPECT_LT(max_rel_err(dx3, dx1), 1e-12);
  EXPECT_LT(max_rel_err(dw3, dw1), 1e-12);
  EXPECT_LT(max_rel_err(db3, db1), 1e-12);
}

TEST(Linear, FloatKernelMatchesDoubleKernel) {
  const int batch = 7, in = 800, out = 128;
  const auto xd = random_vec(size_t(batch) * in, 9), wd = random_vec(size_t(out) * in, 10, 0.05),
             bd = random_vec(size_t(out), 11), dyd = random_vec(size_t(batch) * out, 12);
  std::vector<double> yd(dyd.size()), dxd(xd.size()), dwd(wd.size(), 0.0), dbd(bd.size(), 0.0);
  cpu::linear_forward(batch, in, out, xd.data(), wd.data(), bd.data(), yd.data());
  cpu::linear_backward(batch, in, out, xd.data(), wd.data(), dyd.data(), dwd.data(), dbd.data(),
                       dxd.data());

  GraphBuilder gb("m", {50, 4, 4}, false);
  const Graph graph = gb.finish(gb.linear("fc1", gb.input(), out));
  EXPECT_EQ(graph.output_shape(), (Shape{128, 1, 1}));
  const auto r = test::run_cpu_kernel(graph, 0, batch, {test::to_float(xd)}, {test::to_float(wd), test::to_float(bd)},
                                      test::to_float(dyd));
  EXPECT_LT(test::scaled_err(r.y, yd), 1e-5);
  EXPECT_LT(test::scaled_err(r.dx[0], dxd), 1e-5);
  EXPECT_LT(test::scaled_err(r.dp[0], dwd), 1e-5);
  EXPECT_LT(test::scaled_err(r.dp[1], dbd), 1e-5);
}

// The float kernels of the parameter-free ops against their double twins.
TEST(FloatKernels, ReluPoolFlattenMatchDoubleOps) {
  const Shape in{3, 6, 7};
  const int batch = 2;
  const auto xd = random_vec(size_t(batch) * in.numel(), 13);
  const auto x = test::to_float(xd);
  GraphBuilder gb("m", in, false);
  const int relu = gb.relu("relu1", gb.input());
  const int pool = gb.avg_pool2("pool1", relu);
  const Graph graph = gb.finish(gb.flatten("flatten", pool));

  const auto rr = test::run_cpu_kernel(graph, 0, batch, {x}, {}, x);
  std::vector<double> ryd(xd.size()), rdxd(xd.size());
  cpu::relu_forward(int64_t(xd.size()), xd.data(), ryd.data());
  cpu::relu_backward(int64_t(xd.size()), ryd.data(), xd.data(), rdxd.data());
  EXPECT_LT(test::scaled_err(rr.y, ryd), 1e-7);
  EXPECT_LT(test::scaled_err(rr.dx[0], rdxd), 1e-7);

  EXPECT_EQ(graph.values[size_t(pool)], (Shape{3, 3, 3}));
  const std::vector<float> pdy(size_t(batch) * 27, 0.5f);
  const auto rp = test::run_cpu_kernel(graph, 1, batch, {x}, {}, pdy);
  std::vector<double> pyd(rp.y.size()), pdxd(xd.size());
  cpu::avgpool2_forward(batch * 3, 6, 7, xd.data(), pyd.data());
  cpu::avgpool2_backward(batch * 3, 6, 7, std::vector<double>(pdy.begin(), pdy.end()).data(), pdxd.data());
  EXPECT_LT(test::scaled_err(rp.y, pyd), 1e-6);
  EXPECT_LT(test::scaled_err(rp.dx[0], pdxd), 1e-6);

  const std::vector<float> px(size_t(batch) * 27, 0.25f);
  const auto rf = test::run_cpu_kernel(graph, 2, batch, {px}, {}, px);
  EXPECT_EQ(graph.output_shape(), (Shape{27, 1, 1}));
  EXPECT_EQ(rf.y, px);
  EXPECT_EQ(rf.dx[0], px);
}

TEST(SoftmaxCrossEntropy, ValueAndGradientMatchFiniteDifferences) {
  const int batch = 4, classes = 5;
  auto z = random_vec(size_t(batch) * classes, 14, 3.0);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  std::vector<double> dz(z.size());
  const double loss = cpu::softmax_cross_entropy(z.data(), labels.data(), batch, classes, dz.data());
  // The definition, row by row.
  double want = 0;
  for (int r = 0; r < batch; ++r) {
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(z[size_t(r) * classes + c]);
    want += -std::log(std::exp(z[size_t(r) * classes + labels[r]]) / sum);
  }
  EXPECT_NEAR(loss, want / batch, 1e-12);
  auto f = [&] {
    return cpu::softmax_cross_entropy<double>(z.data(), labels.data(), batch, classes, nullptr);
  };
  EXPECT_LT(max_rel_err(dz, test::numeric_grad(z, f)), 1e-6);
  // Each row of the gradient sums to zero (softmax sums to one).
  for (int r = 0; r < batch; ++r) {
    double s = 0;
    for (int c = 0; c < classes; ++c) s += dz[size_t(r) * classes + c];
    EXPECT_NEAR(s, 0.0, 1e-12);
  }
}

TEST(SoftmaxCrossEntropy, StableForHugeLogits) {
  const std::vector<float> z = {1000.0f, 1001.0f, 999.0f, -1000.0f, 0.0f, 1000.0f};
  const std::vector<float> shifted = {1.0f, 2.0f, 0.0f, -1000.0f, 0.0f, 1000.0f};
  const std::vector<int32_t> labels = {1, 2};
  std::vector<float> dz(6), dz2(6);
  const float loss = softmax_cross_entropy(z.data(), labels.data(), 2, 3, dz.data());
  EXPECT_TRUE(std::isfinite(loss));
  for (float v : dz) EXPECT_TRUE(std::isfinite(v));
  // Row 0 is shift-invariant; row 1 puts all its mass on its label: loss 0.
  const float l2 = softmax_cross_entropy(shifted.data(), labels.data(), 2, 3, dz2.data());
  EXPECT_NEAR(loss, l2, 1e-5);
  EXPECT_NEAR(dz[0], dz2[0], 1e-6);
  EXPECT_NEAR(dz[5], 0.0f, 1e-6);
}

TEST(SoftmaxCrossEntropy, RejectsBadLabels) {
  const std::vector<float> z(6, 0.0f);
  const std::vector<int32_t> labels = {0, 3};
  try {
    softmax_cross_entropy(z.data(), labels.data(), 2, 3, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3"), std::string::npos) << e.what();
  }
}

TEST(CountCorrect, CountsArgMaxHits) {
  const std::vector<float> z = {0.1f, 0.9f, 0.0f,   // argmax 1
                                2.0f, 1.0f, 0.0f,   // argmax 0
                                0.0f, 0.0f, 5.0f};  // argmax 2
  const std::vector<int32_t> labels = {1, 2, 2};
  EXPECT_EQ(count_correct(z.data(), labels.data(), 3, 3), 2);
}

}  // namespace
}  // namespace ddp::nn
