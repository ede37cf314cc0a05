// conv2d: forward against a direct loop, backward against finite differences,
// chunked batches against single images, and the float layer against the
// double kernel.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu_ops.hpp"
#include "ddp/nn/layers.hpp"
#include "ddp/nn/thread_pool.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using cpu::ConvGeom;
using test::conv_geom;
using test::max_rel_err;
using test::random_vec;

size_t x_size(const ConvGeom& g) { return size_t(g.batch) * g.in_c * g.in_h * g.in_w; }
size_t y_size(const ConvGeom& g) { return size_t(g.batch) * g.out_c * g.out_h() * g.out_w(); }
size_t w_size(const ConvGeom& g) { return size_t(g.out_c) * g.in_c * g.k * g.k; }

// The definition, written out as plainly as possible.
std::vector<double> conv_direct(const ConvGeom& g, const std::vector<double>& x,
                                const std::vector<double>& w, const std::vector<double>& b) {
  const int OH = g.out_h(), OW = g.out_w();
  std::vector<double> y(y_size(g));
  for (int n = 0; n < g.batch; ++n)
    for (int o = 0; o < g.out_c; ++o)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double s = b[o];
          for (int c = 0; c < g.in_c; ++c)
            for (int kh = 0; kh < g.k; ++kh)
              for (int kw = 0; kw < g.k; ++kw) {
                const int ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
                if (ih < 0 || ih >= g.in_h || iw < 0 || iw >= g.in_w) continue;
                s += w[((o * g.in_c + c) * g.k + kh) * g.k + kw] *
                     x[((size_t(n) * g.in_c + c) * g.in_h + ih) * g.in_w + iw];
              }
          y[((size_t(n) * g.out_c + o) * OH + oh) * OW + ow] = s;
        }
  return y;
}

struct ConvCase {
  int batch, c, h, w, oc, k, stride, pad;
};
void PrintTo(const ConvCase& p, std::ostream* os) {
  *os << "batch " << p.batch << " in " << p.c << "x" << p.h << "x" << p.w << " out_c " << p.oc
      << " k " << p.k << " stride " << p.stride << " pad " << p.pad;
}

class ConvGrad : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvGrad, ForwardMatchesDirectLoop) {
  const ConvCase p = GetParam();
  const ConvGeom g = conv_geom(p.batch, p.c, p.h, p.w, p.oc, p.k, p.stride, p.pad);
  const auto x = random_vec(x_size(g), 1), w = random_vec(w_size(g), 2),
             b = random_vec(size_t(g.out_c), 3);
  std::vector<double> y(y_size(g));
  cpu::ConvScratch<double> ws;
  cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y.data(), ws);
  EXPECT_LT(max_rel_err(y, conv_direct(g, x, w, b)), 1e-12);
}

// L = <r, conv(x; w, b)>; backward with dy = r must give dL/dx, dL/dw, dL/db.
TEST_P(ConvGrad, BackwardMatchesFiniteDifferences) {
  const ConvCase p = GetParam();
  const ConvGeom g = conv_geom(p.batch, p.c, p.h, p.w, p.oc, p.k, p.stride, p.pad);
  auto x = random_vec(x_size(g), 4), w = random_vec(w_size(g), 5),
       b = random_vec(size_t(g.out_c), 6);
  const auto r = random_vec(y_size(g), 7);
  cpu::ConvScratch<double> ws;
  std::vector<double> y(y_size(g));
  auto loss = [&] {
    cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y.data(), ws);
    return test::dot(r, y);
  };
  std::vector<double> dx(x.size(), -7.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  cpu::conv2d_backward(g, x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data(), ws);

  EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss)), 1e-6) << "dx";
  EXPECT_LT(max_rel_err(dw, test::numeric_grad(w, loss)), 1e-6) << "dw";
  EXPECT_LT(max_rel_err(db, test::numeric_grad(b, loss)), 1e-6) << "db";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvGrad,
    ::testing::Values(ConvCase{2, 1, 6, 6, 3, 3, 1, 0},     // LeNet conv1's form
                      ConvCase{2, 3, 9, 9, 2, 5, 1, 0},     // conv2's form: C > 1, k = 5
                      ConvCase{3, 2, 7, 5, 4, 3, 1, 1},     // padding, non-square
                      ConvCase{1, 2, 5, 19, 3, 3, 1, 1},    // rows wider than a vector
                      ConvCase{2, 2, 7, 7, 3, 3, 2, 1},     // stride 2
                      ConvCase{1, 1, 4, 4, 2, 1, 1, 0}));   // 1x1 kernel

// A batch big enough for several im2col chunks must equal image-by-image.
TEST(Conv2d, ChunkedBatchAndThreadsEqualSingleImages) {
  const ConvGeom g = conv_geom(7, 6, 13, 13, 50, 5, 1, 0);  // conv2's form; chunks of 4 + 3 in double
  const auto x = random_vec(x_size(g), 8), w = random_vec(w_size(g), 9),
             b = random_vec(size_t(g.out_c), 10), dy = random_vec(y_size(g), 11);
  cpu::ConvScratch<double> ws;
  std::vector<double> y(y_size(g)), dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y.data(), ws);
  cpu::conv2d_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), ws);

  ConvGeom one = g;
  one.batch = 1;
  const size_t xi = x_size(one), yi = y_size(one);
  std::vector<double> y1(y.size()), dx1(dx.size()), dw1(w.size(), 0.0), db1(b.size(), 0.0);
  cpu::ConvScratch<double> ws1;
  for (int n = 0; n < g.batch; ++n) {
    cpu::conv2d_forward(one, x.data() + n * xi, w.data(), b.data(), y1.data() + n * yi, ws1);
    cpu::conv2d_backward(one, x.data() + n * xi, w.data(), dy.data() + n * yi, dw1.data(),
                         db1.data(), dx1.data() + n * xi, ws1);
  }
  EXPECT_LT(max_rel_err(y, y1), 1e-10);
  EXPECT_LT(max_rel_err(dx, dx1), 1e-10);
  EXPECT_LT(max_rel_err(dw, dw1), 1e-10);
  EXPECT_LT(max_rel_err(db, db1), 1e-10);

  // And the chunks shared over threads, gradients summed across them.
  ThreadPool pool(3);
  cpu::ConvScratch<double> ws3;
  std::vector<double> y3(y.size()), dx3(dx.size()), dw3(w.size(), 0.0), db3(b.size(), 0.0);
  cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y3.data(), ws3, &pool);
  cpu::conv2d_backward(g, x.data(), w.data(), dy.data(), dw3.data(), db3.data(), dx3.data(), ws3,
                       &pool);
  EXPECT_LT(max_rel_err(y3, y1), 1e-10);
  EXPECT_LT(max_rel_err(dx3, dx1), 1e-10);
  EXPECT_LT(max_rel_err(dw3, dw1), 1e-10);
  EXPECT_LT(max_rel_err(db3, db1), 1e-10);
}

// Note [gradient accumulation]: a second backward adds the same again.
TEST(Conv2d, BackwardAccumulatesParameterGradients) {
  const ConvGeom g = conv_geom(2, 2, 6, 6, 3, 3, 1, 0);
  const auto x = random_vec(x_size(g), 12), w = random_vec(w_size(g), 13),
             dy = random_vec(y_size(g), 14);
  cpu::ConvScratch<double> ws;
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(3, 0.0);
  cpu::conv2d_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), ws);
  const auto dw1 = dw, db1 = db, dx1 = dx;
  cpu::conv2d_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), ws);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw[i], 2 * dw1[i]);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_DOUBLE_EQ(db[i], 2 * db1[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_DOUBLE_EQ(dx[i], dx1[i]) << "dx is overwritten";
}

// The float layer (what models run) agrees with the double kernel.
TEST(Conv2d, FloatLayerMatchesDoubleKernel) {
  const ConvGeom g = conv_geom(9, 20, 13, 13, 50, 5, 1, 0);  // several float chunks too
  const auto xd = random_vec(x_size(g), 15), wd = random_vec(w_size(g), 16, 0.1),
             bd = random_vec(50, 17), dyd = random_vec(y_size(g), 18);
  cpu::ConvScratch<double> ws;
  std::vector<double> yd(y_size(g)), dxd(xd.size()), dwd(wd.size(), 0.0), dbd(50, 0.0);
  cpu::conv2d_forward(g, xd.data(), wd.data(), bd.data(), yd.data(), ws);
  cpu::conv2d_backward(g, xd.data(), wd.data(), dyd.data(), dwd.data(), dbd.data(), dxd.data(), ws);

  Conv2d layer("conv2", {20, 13, 13}, 50, 5);
  auto w = test::to_float(wd), b = test::to_float(bd);
  std::vector<float> dw(w.size(), 0.0f), db(50, 0.0f);
  layer.bind({w.data(), b.data()}, {dw.data(), db.data()});
  const auto x = test::to_float(xd), dy = test::to_float(dyd);
  std::vector<float> y(yd.size()), dx(xd.size());
  layer.forward(x.data(), g.batch, y.data());
  layer.backward(x.data(), y.data(), dy.data(), g.batch, dx.data());

  EXPECT_LT(test::scaled_err(y, yd), 1e-5);
  EXPECT_LT(test::scaled_err(dx, dxd), 1e-5);
  EXPECT_LT(test::scaled_err(dw, dwd), 1e-5);
  EXPECT_LT(test::scaled_err(db, dbd), 1e-5);
}

TEST(Conv2d, LayerRejectsWrongInputShape) {
  Conv2d layer("conv1", {1, 28, 28}, 20, 3);
  EXPECT_EQ(layer.output_shape({1, 28, 28}), (Shape{20, 26, 26}));
  try {
    layer.output_shape({3, 28, 28});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Conv2d("big", {1, 4, 4}, 2, 5), Error);
}

}  // namespace
}  // namespace ddp::nn
