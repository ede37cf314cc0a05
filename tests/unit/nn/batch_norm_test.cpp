// BatchNorm2d, the residual add and global average pooling: the double
// kernels against PyTorch's formulas and central differences, the float
// kernels (what models run) against the double ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu_model.hpp"
#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/graph.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using test::numeric_grad;
using test::random_vec;

constexpr double kEps = 1e-5;

// torch.nn.BatchNorm2d's training forward, written out per channel in double.
struct Reference {
  std::vector<double> y, mean, var;  // var: biased, what normalises
};
Reference pytorch_bn(int batch, int c, int hw, const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b) {
  Reference r;
  r.y.resize(x.size());
  const double n = double(batch) * hw;
  for (int ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int i = 0; i < batch; ++i)
      for (int k = 0; k < hw; ++k) sum += x[size_t((i * c + ch) * hw + k)];
    const double mean = sum / n;
    for (int i = 0; i < batch; ++i)
      for (int k = 0; k < hw; ++k) sq += std::pow(x[size_t((i * c + ch) * hw + k)] - mean, 2);
    const double var = sq / n;
    r.mean.push_back(mean);
    r.var.push_back(var);
    for (int i = 0; i < batch; ++i)
      for (int k = 0; k < hw; ++k) {
        const size_t j = size_t((i * c + ch) * hw + k);
        r.y[j] = (x[j] - mean) / std::sqrt(var + kEps) * w[size_t(ch)] + b[size_t(ch)];
      }
  }
  return r;
}

// Our double kernels, composed as the BatchNorm kernel composes them.
struct Ours {
  std::vector<double> y, mean, invstd;
};
Ours our_bn(int batch, int c, int hw, const std::vector<double>& x, const std::vector<double>& w,
            const std::vector<double>& b) {
  Ours o;
  const double n = double(batch) * hw;
  std::vector<double> s(static_cast<size_t>(c)), sq(s), scale(s), shift(s);
  cpu::bn_sum(batch, c, hw, x.data(), s.data());
  for (int ch = 0; ch < c; ++ch) o.mean.push_back(s[size_t(ch)] / n);
  cpu::bn_sum_sq_dev(batch, c, hw, x.data(), o.mean.data(), sq.data());
  for (int ch = 0; ch < c; ++ch) {
    o.invstd.push_back(1 / std::sqrt(sq[size_t(ch)] / n + kEps));
    scale[size_t(ch)] = w[size_t(ch)] * o.invstd.back();
    shift[size_t(ch)] = b[size_t(ch)] - o.mean[size_t(ch)] * scale[size_t(ch)];
  }
  o.y.resize(x.size());
  cpu::bn_apply(batch, c, hw, x.data(), scale.data(), shift.data(), o.y.data());
  return o;
}

TEST(BatchNorm, TrainingForwardIsPytorchs) {
  const int batch = 3, c = 4, hw = 5;
  const auto x = random_vec(size_t(batch * c * hw), 1, 2.0), w = random_vec(4, 2), b = random_vec(4, 3);
  const Reference want = pytorch_bn(batch, c, hw, x, w, b);
  const Ours got = our_bn(batch, c, hw, x, w, b);
  EXPECT_LT(test::max_rel_err(got.y, want.y), 1e-12);
  EXPECT_LT(test::max_rel_err(got.mean, want.mean), 1e-12);
}

TEST(BatchNorm, BackwardMatchesFiniteDifferences) {
  const int batch = 3, c = 2, hw = 6;
  auto x = random_vec(size_t(batch * c * hw), 4, 1.5), w = random_vec(2, 5), b = random_vec(2, 6);
  const auto r = random_vec(x.size(), 7);  // loss = sum(r * y)
  const double n = double(batch) * hw;
  const Ours o = our_bn(batch, c, hw, x, w, b);
  std::vector<double> sdy(2), sdx(2), dx(x.size()), dw(2, 0.0), db(2, 0.0);
  cpu::bn_grad_sums(batch, c, hw, x.data(), o.mean.data(), r.data(), sdy.data(), sdx.data());
  for (int ch = 0; ch < c; ++ch) {
    dw[size_t(ch)] += sdx[size_t(ch)] * o.invstd[size_t(ch)];
    db[size_t(ch)] += sdy[size_t(ch)];
  }
  cpu::bn_backward_apply(batch, c, hw, x.data(), o.mean.data(), o.invstd.data(), w.data(), r.data(), sdy.data(),
                         sdx.data(), n, dx.data());
  auto loss = [&] { return test::dot(r, our_bn(batch, c, hw, x, w, b).y); };
  EXPECT_LT(test::max_rel_err(dx, numeric_grad(x, loss), 1e-6), 1e-5);
  EXPECT_LT(test::max_rel_err(dw, numeric_grad(w, loss), 1e-6), 1e-5);
  EXPECT_LT(test::max_rel_err(db, numeric_grad(b, loss), 1e-6), 1e-5);
}

// The float kernel: output and gradients as the double kernels give them, the
// running statistics moved as torch.nn.BatchNorm2d moves them (momentum 0.1,
// the unbiased variance), and one more batch counted.
TEST(BatchNorm, FloatKernelMatchesAndMovesTheRunningStatistics) {
  const int batch = 5, c = 3, h = 4, w = 4, hw = h * w;
  const auto xd = random_vec(size_t(batch * c * hw), 8, 2.0), wd = random_vec(3, 9), bd = random_vec(3, 10),
             dyd = random_vec(xd.size(), 11);
  GraphBuilder gb("m", {c, h, w}, true);
  const int y = gb.batch_norm("bn", gb.input());
  const Graph g = gb.finish(gb.flatten("flat", y));
  std::vector<std::vector<float>> buf = {{0.5f, -1.0f, 2.0f}, {1.0f, 2.0f, 0.25f}};
  const auto before = buf;
  const auto run = test::run_cpu_kernel(g, 0, batch, {test::to_float(xd)}, {test::to_float(wd), test::to_float(bd)},
                                        test::to_float(dyd), 2, &buf);
  const Reference want = pytorch_bn(batch, c, hw, xd, wd, bd);
  EXPECT_LT(test::scaled_err(run.y, want.y), 1e-5);
  const double n = double(batch) * hw;
  for (int ch = 0; ch < c; ++ch) {
    EXPECT_NEAR(buf[0][size_t(ch)], 0.9 * before[0][size_t(ch)] + 0.1 * want.mean[size_t(ch)], 1e-5);
    EXPECT_NEAR(buf[1][size_t(ch)], 0.9 * before[1][size_t(ch)] + 0.1 * want.var[size_t(ch)] * n / (n - 1), 1e-5);
  }
  const Ours o = our_bn(batch, c, hw, xd, wd, bd);
  std::vector<double> sdy(3), sdx(3), dx(xd.size());
  cpu::bn_grad_sums(batch, c, hw, xd.data(), o.mean.data(), dyd.data(), sdy.data(), sdx.data());
  cpu::bn_backward_apply(batch, c, hw, xd.data(), o.mean.data(), o.invstd.data(), wd.data(), dyd.data(), sdy.data(),
                         sdx.data(), n, dx.data());
  EXPECT_LT(test::scaled_err(run.dx[0], dx), 1e-5);
  for (int ch = 0; ch < c; ++ch) {
    EXPECT_NEAR(run.dp[0][size_t(ch)], sdx[size_t(ch)] * o.invstd[size_t(ch)], 1e-4);
    EXPECT_NEAR(run.dp[1][size_t(ch)], sdy[size_t(ch)], 1e-4);
  }
}

TEST(BatchNorm, TrainingOnOneValuePerChannelIsRefused) {
  GraphBuilder gb("m", {2, 1, 1}, true);
  const Graph g = gb.finish(gb.flatten("flat", gb.batch_norm("bn", gb.input())));
  std::vector<std::vector<float>> buf = {{0, 0}, {1, 1}};
  EXPECT_THROW(test::run_cpu_kernel(g, 0, 1, {{1.f, 2.f}}, {{1.f, 1.f}, {0.f, 0.f}}, {}, 1, &buf), Error);
}

TEST(Add, BackwardMatchesFiniteDifferences) {
  for (const bool relu : {false, true}) {
    auto a = random_vec(40, 12), b = random_vec(40, 13);
    const auto r = random_vec(40, 14);
    std::vector<double> y(40), da(40), db(40);
    auto loss = [&] {
      cpu::add_forward(40, a.data(), b.data(), relu, y.data());
      return test::dot(r, y);
    };
    loss();
    cpu::add_backward(40, y.data(), relu, r.data(), da.data(), db.data());
    EXPECT_LT(test::max_rel_err(da, numeric_grad(a, loss), 1e-6), 1e-6) << "relu " << relu;
    EXPECT_LT(test::max_rel_err(db, numeric_grad(b, loss), 1e-6), 1e-6) << "relu " << relu;
  }
}

TEST(GlobalAvgPool, ForwardIsThePlaneMeanAndBackwardMatchesFiniteDifferences) {
  auto x = random_vec(6 * 16, 15);
  const auto r = random_vec(6, 16);
  std::vector<double> y(6), dx(x.size());
  cpu::global_avgpool_forward(6, 16, x.data(), y.data());
  for (int p = 0; p < 6; ++p) {
    double s = 0;
    for (int i = 0; i < 16; ++i) s += x[size_t(p * 16 + i)];
    EXPECT_NEAR(y[size_t(p)], s / 16, 1e-14);
  }
  auto loss = [&] {
    cpu::global_avgpool_forward(6, 16, x.data(), y.data());
    return test::dot(r, y);
  };
  cpu::global_avgpool_backward(6, 16, r.data(), dx.data());
  EXPECT_LT(test::max_rel_err(dx, numeric_grad(x, loss), 1e-6), 1e-7);
}

}  // namespace
}  // namespace ddp::nn
