// The GPU kernels' arithmetic (nn/kernel_math.hpp), run on the host against
// the CPU kernels: each *_at function over every index of a tensor must give
// what the CPU op gives, and Linear's GEMM shapes, run through a
// column-major cblas_sgemm as cuBLAS would run them, must give the CPU's
// Linear. These run on every machine; the kernels' launches, cuDNN and
// cuBLAS themselves are the Cuda* tests' (GPU only).
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/kernel_math.hpp"
#include "ddp/nn/model.hpp"  // count_correct
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using test::max_rel_err;
using test::random_vec;
using test::to_float;

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// The (planes, h, w) the pooling tests cover: even, odd rows and columns,
// LeNet's 28x28 and 10x10 planes, the smallest.
const std::vector<std::tuple<int, int, int>> kPoolShapes = {{3, 4, 6}, {2, 5, 7}, {4, 28, 28}, {6, 10, 10},
                                                            {1, 3, 2}, {2, 2, 3}};

// With relu, the reference pools the rectified input (ConvReluPool).
TEST(KernelMath, PoolForwardMatchesTheCpu) {
  for (bool relu : {false, true})
    for (auto [planes, h, w] : kPoolShapes) {
      auto x = to_float(random_vec(size_t(planes) * h * w, 11));
      x[0] = 0.0f;  // relu's kink itself
      std::vector<float> pooled_in = x;
      if (relu) cpu::relu_forward(int64_t(x.size()), x.data(), pooled_in.data());
      const size_t n = size_t(planes) * (h / 2) * (w / 2);
      std::vector<float> got(n), want(n);
      for (size_t i = 0; i < n; ++i) got[i] = kernel::avgpool2_forward_at(int64_t(i), h, w, x.data(), relu);
      cpu::avgpool2_forward(planes, h, w, pooled_in.data(), want.data());
      EXPECT_LT(max_rel_err(to_double(got), to_double(want)), 1e-6)
          << planes << "x" << h << "x" << w << (relu ? " with relu" : "");
    }
}

TEST(KernelMath, PoolBackwardMatchesTheCpuOnEveryInput) {
  for (auto [planes, h, w] : kPoolShapes) {
    const auto dy = to_float(random_vec(size_t(planes) * (h / 2) * (w / 2), 13));
    const size_t n = size_t(planes) * h * w;
    std::vector<float> got(n, 42.0f), want(n, 42.0f);
    for (size_t i = 0; i < n; ++i) got[i] = kernel::avgpool2_backward_at(int64_t(i), h, w, dy.data(), nullptr);
    cpu::avgpool2_backward(planes, h, w, dy.data(), want.data());
    EXPECT_LT(max_rel_err(to_double(got), to_double(want)), 1e-6) << planes << "x" << h << "x" << w;
  }
}

// With the conv output as mask, backward is the relu-pool's gradient: the
// pooled gradient, then relu's backward at that output.
TEST(KernelMath, MaskedPoolBackwardIsTheReluPoolGradient) {
  for (auto [planes, h, w] : kPoolShapes) {
    auto pre = to_float(random_vec(size_t(planes) * h * w, 14));
    pre[0] = 0.0f;  // relu passes nothing at zero
    const auto dy = to_float(random_vec(size_t(planes) * (h / 2) * (w / 2), 15));
    const size_t n = pre.size();
    std::vector<float> got(n), pooled(n), rect(n), want(n, 42.0f);
    for (size_t i = 0; i < n; ++i) got[i] = kernel::avgpool2_backward_at(int64_t(i), h, w, dy.data(), pre.data());
    cpu::avgpool2_backward(planes, h, w, dy.data(), pooled.data());
    cpu::relu_forward(int64_t(n), pre.data(), rect.data());
    cpu::relu_backward(int64_t(n), rect.data(), pooled.data(), want.data());
    EXPECT_LT(max_rel_err(to_double(got), to_double(want)), 1e-6) << planes << "x" << h << "x" << w;
    EXPECT_EQ(got[0], 0.0f);
  }
}

TEST(KernelMath, ReluMatchesTheCpu) {
  auto x = to_float(random_vec(257, 16));
  x[3] = 0.0f;
  x[4] = std::nanf("");
  const auto dy = to_float(random_vec(x.size(), 17));
  std::vector<float> y(x.size()), dx(x.size()), want_y(x.size()), want_dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = kernel::relu_at(x[i]);
  for (size_t i = 0; i < x.size(); ++i) dx[i] = kernel::relu_grad_at(y[i], dy[i]);
  cpu::relu_forward(int64_t(x.size()), x.data(), want_y.data());
  cpu::relu_backward(int64_t(x.size()), want_y.data(), dy.data(), want_dx.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], want_y[i]) << i;  // a NaN input gives 0 on both
    EXPECT_EQ(dx[i], want_dx[i]) << i;
  }
}

// kernel_math.hpp's gemm callback as cuBLAS would take it: column-major,
// alpha 1. OpenBLAS rejects a leading dimension too small for its matrix, so
// a wrong shape shows as a wrong result.
void colmajor_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                   float beta, float* c, int ldc) {
  cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda,
              b, ldb, beta, c, ldc);
}

// (batch, in, out): all different, so a swapped dimension cannot pass.
const std::vector<std::tuple<int, int, int>> kLinearShapes = {{5, 7, 3}, {16, 120, 84}, {1, 4, 9}, {33, 84, 10}};

// CudaLinear::forward's recipe: the bias rows, then the GEMM adds x W^T.
TEST(KernelMath, LinearForwardMatchesTheCpu) {
  for (auto [batch, in, out] : kLinearShapes) {
    const auto x = to_float(random_vec(size_t(batch) * in, 21));
    const auto w = to_float(random_vec(size_t(out) * in, 22));
    const auto b = to_float(random_vec(size_t(out), 23));
    for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> got(size_t(batch) * out), want(got.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = kernel::linear_bias_at(int64_t(i), out, bias);
      kernel::linear_forward_gemm(batch, in, out, x.data(), w.data(), got.data(), colmajor_gemm);
      cpu::linear_forward(batch, in, out, x.data(), w.data(), bias, want.data());
      EXPECT_LT(max_rel_err(to_double(got), to_double(want), 1e-5), 1e-5)
          << batch << "x" << in << "->" << out << (bias ? " with bias" : " without bias");
    }
  }
}

// CudaLinear::backward's recipe: the bias gradient per feature, then the
// GEMMs; dW and db are added to, dx is overwritten.
TEST(KernelMath, LinearBackwardMatchesTheCpu) {
  for (auto [batch, in, out] : kLinearShapes) {
    const auto x = to_float(random_vec(size_t(batch) * in, 31));
    const auto w = to_float(random_vec(size_t(out) * in, 32));
    const auto dy = to_float(random_vec(size_t(batch) * out, 33));
    const auto dw0 = to_float(random_vec(w.size(), 34));
    const auto db0 = to_float(random_vec(size_t(out), 35));
    for (bool with_dx : {true, false}) {
      std::vector<float> dw = dw0, db = db0, dx(x.size(), 42.0f);
      std::vector<float> want_dw = dw0, want_db = db0, want_dx(x.size(), 42.0f);
      for (int o = 0; o < out; ++o) db[size_t(o)] = kernel::linear_bias_grad_at(o, batch, out, dy.data(), db[size_t(o)]);
      kernel::linear_backward_gemm(batch, in, out, x.data(), w.data(), dy.data(), dw.data(),
                                   with_dx ? dx.data() : nullptr, colmajor_gemm);
      cpu::linear_backward(batch, in, out, x.data(), w.data(), dy.data(), want_dw.data(), want_db.data(),
                           with_dx ? want_dx.data() : nullptr);
      const std::string at = std::to_string(batch) + "x" + std::to_string(in) + "->" + std::to_string(out);
      EXPECT_LT(max_rel_err(to_double(dw), to_double(want_dw), 1e-5), 1e-5) << "dW " << at;
      EXPECT_LT(max_rel_err(to_double(db), to_double(want_db), 1e-5), 1e-5) << "db " << at;
      EXPECT_LT(max_rel_err(to_double(dx), to_double(want_dx), 1e-5), 1e-5) << "dx " << at << " " << with_dx;
    }
  }
}

// The loss kernel's rows (rows_kernel in nn/cuda/loss.cu): each row's loss
// summed, then divided by the batch, is the CPU's mean loss, and the
// gradients are the CPU's.
TEST(KernelMath, SoftmaxRowsMatchTheCpuLoss) {
  for (auto [batch, classes] : {std::tuple{37, 10}, std::tuple{1, 3}, std::tuple{8, 1}}) {
    const auto z = to_float(random_vec(size_t(batch) * classes, 41, 3.0));
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (int r = 0; r < batch; ++r) labels[size_t(r)] = (r * 7 + 3) % classes;
    std::vector<float> d(z.size(), 42.0f), want_d(z.size());
    double total = 0;
    for (int r = 0; r < batch; ++r) {
      const float* row = z.data() + int64_t(r) * classes;
      total += kernel::softmax_xent_row(row, kernel::argmax_row(row, classes), labels[size_t(r)], classes,
                                        1.0 / batch, d.data() + int64_t(r) * classes);
    }
    const float want = cpu::softmax_cross_entropy(z.data(), labels.data(), batch, classes, want_d.data());
    EXPECT_NEAR(total / batch, want, 1e-6 * (1 + std::abs(want))) << batch << "x" << classes;
    EXPECT_LT(max_rel_err(to_double(d), to_double(want_d), 1e-7), 1e-6) << batch << "x" << classes;
  }
}

TEST(KernelMath, ArgmaxCountsTheRowsTheCpuCounts) {
  // Ties: the first maximum wins, as torch.argmax and count_correct.
  const std::vector<float> z = {1, 3, 3, 0,    //
                                5, 5, 5, 5,    //
                                -1, -2, -0.5f, -0.5f};
  for (const std::vector<int32_t>& labels :
       {std::vector<int32_t>{1, 0, 2}, std::vector<int32_t>{2, 3, 3}, std::vector<int32_t>{1, 1, 2}}) {
    int64_t got = 0;
    for (int r = 0; r < 3; ++r) got += kernel::argmax_row(z.data() + 4 * r, 4) == labels[size_t(r)] ? 1 : 0;
    EXPECT_EQ(got, count_correct(z.data(), labels.data(), 3, 4)) << labels[0] << labels[1] << labels[2];
  }
  EXPECT_EQ(kernel::argmax_row(z.data(), 4), 1);
  EXPECT_EQ(kernel::argmax_row(z.data() + 4, 4), 0);
  EXPECT_EQ(kernel::argmax_row(z.data() + 8, 4), 2);
}

TEST(KernelMath, AddAndItsReluMatchTheCpu) {
  const auto a = to_float(random_vec(300, 41)), b = to_float(random_vec(300, 42)), dy = to_float(random_vec(300, 43));
  for (const bool relu : {false, true}) {
    std::vector<float> y(300), da(300), db(300), got(300), dgot(300);
    cpu::add_forward<float>(300, a.data(), b.data(), relu, y.data());
    cpu::add_backward<float>(300, y.data(), relu, dy.data(), da.data(), db.data());
    for (size_t i = 0; i < 300; ++i) {
      got[i] = kernel::add_at(a[i], b[i], relu);
      dgot[i] = kernel::add_grad_at(got[i], dy[i], relu);
    }
    EXPECT_EQ(got, y) << "relu " << relu;
    EXPECT_EQ(dgot, da) << "relu " << relu;
    EXPECT_EQ(dgot, db) << "relu " << relu;
  }
}

TEST(KernelMath, GlobalAvgPoolMatchesTheCpu) {
  const auto x = to_float(random_vec(6 * 16, 44)), dy = to_float(random_vec(6, 45));
  std::vector<float> y(6), dx(x.size()), got(6), dgot(x.size());
  cpu::global_avgpool_forward<float>(6, 16, x.data(), y.data());
  cpu::global_avgpool_backward<float>(6, 16, dy.data(), dx.data());
  for (int64_t p = 0; p < 6; ++p) got[size_t(p)] = kernel::global_avgpool_at(p, 16, x.data());
  for (size_t i = 0; i < x.size(); ++i) dgot[i] = kernel::global_avgpool_grad_at(int64_t(i), 16, dy.data());
  EXPECT_EQ(got, y);
  EXPECT_EQ(dgot, dx);
}

// The GPU's BatchNorm runs per element what the CPU's runs per channel: the
// element formulas, with the constants from the channel functions (which the
// CPU kernel uses itself), give the CPU's output and input gradient.
TEST(KernelMath, BatchNormElementsMatchTheCpu) {
  const int batch = 3, c = 4, hw = 10;
  const double count = double(batch) * hw;
  const auto x = to_float(random_vec(size_t(batch * c * hw), 46, 2.0)), dy = to_float(random_vec(x.size(), 47));
  const auto w = to_float(random_vec(4, 48)), b = to_float(random_vec(4, 49));
  std::vector<double> sum(4), sq(4), sdy(4), sdx(4);
  std::vector<float> mean(4), invstd(4), scale(4), shift(4), rm(4, 0.f), rv(4, 1.f);
  cpu::bn_sum<float>(batch, c, hw, x.data(), sum.data());
  for (int ch = 0; ch < c; ++ch) mean[size_t(ch)] = kernel::bn_mean(sum[size_t(ch)], count);
  cpu::bn_sum_sq_dev<float>(batch, c, hw, x.data(), mean.data(), sq.data());
  for (size_t ch = 0; ch < 4; ++ch)
    kernel::bn_train_channel(sq[ch], count, 1e-5, 0.1, mean[ch], w[ch], b[ch], &invstd[ch], &scale[ch], &shift[ch],
                             &rm[ch], &rv[ch]);
  std::vector<float> y(x.size()), dx(x.size());
  cpu::bn_apply<float>(batch, c, hw, x.data(), scale.data(), shift.data(), y.data());
  cpu::bn_grad_sums<float>(batch, c, hw, x.data(), mean.data(), dy.data(), sdy.data(), sdx.data());
  cpu::bn_backward_apply<float>(batch, c, hw, x.data(), mean.data(), invstd.data(), w.data(), dy.data(), sdy.data(),
                                sdx.data(), count, dx.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t ch = i / size_t(hw) % size_t(c);
    float k, mean_dy, proj;
    kernel::bn_backward_channel(w[ch], invstd[ch], sdy[ch], sdx[ch], count, &k, &mean_dy, &proj);
    EXPECT_EQ(kernel::bn_apply_at(x[i], scale[ch], shift[ch]), y[i]) << i;
    EXPECT_EQ(kernel::bn_backward_at(x[i], dy[i], mean[ch], k, mean_dy, proj), dx[i]) << i;
  }
  // Eval: the running statistics normalise.
  float es, eh;
  kernel::bn_eval_channel(2.0f, 0.5f, 1.0f, 3.0f, 1e-5, &es, &eh);
  EXPECT_NEAR(es, 2.0 / std::sqrt(3.0 + 1e-5), 1e-7);
  EXPECT_NEAR(eh, 0.5 - 1.0 * es, 1e-7);
}

// Where the CPU throws, a kernel cannot: the row's loss and gradient are NaN.
TEST(KernelMath, LabelOutsideTheClassesIsNaN) {
  const std::vector<float> z = {0.5f, -1.0f, 2.0f};
  for (int32_t label : {-1, 3}) {
    std::vector<float> d(3, 0.0f);
    EXPECT_TRUE(std::isnan(kernel::softmax_xent_row(z.data(), 2, label, 3, 1.0, d.data()))) << label;
    for (float v : d) EXPECT_TRUE(std::isnan(v)) << label;
  }
}

}  // namespace
}  // namespace ddp::nn
