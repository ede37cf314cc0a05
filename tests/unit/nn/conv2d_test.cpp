// conv2d: forward against a direct loop, backward against finite differences,
// chunked batches against single images, and the float layer against the
// double kernel.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/conv_engine.hpp"  // conv_chunk_images
#include "ddp/nn/cpu/im2col.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "cpu_model.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"
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
  if (!cpu::winograd_fits(g)) return;
  // Winograd's path with each tile size, which conv2d_forward takes for such
  // layers at batches with more tiles than these.
  // F(4x4)'s transforms round more than F(2x2)'s: their coefficients reach
  // 8, and 1/6 and 1/24 are not binary fractions.
  for (const int tile : {2, 4}) {
    cpu::winograd_conv3x3_forward(g, x.data(), w.data(), b.data(), y.data(), ws, nullptr, tile);
    EXPECT_LT(max_rel_err(y, conv_direct(g, x, w, b)), tile == 2 ? 1e-12 : 1e-10) << "winograd, tiles of " << tile;
  }
}

// L = <r, conv(x; w, b)>; backward with dy = r must give dL/dx, dL/dw, dL/db.
TEST_P(ConvGrad, BackwardMatchesFiniteDifferences) {
  const ConvCase p = GetParam();
  const ConvGeom g = conv_geom(p.batch, p.c, p.h, p.w, p.oc, p.k, p.stride, p.pad);
  auto x = random_vec(x_size(g), 4), w = random_vec(w_size(g), 5),
       b = random_vec(size_t(g.out_c), 6);
  const auto r = random_vec(y_size(g), 7);
  // conv2d's dispatch (tile 0), and for a layer Winograd fits its path alone
  // with each tile size (which conv2d takes at batches with more tiles than
  // these).
  for (const int tile : {0, 2, 4}) {
    const bool winograd = tile != 0;
    if (winograd && !cpu::winograd_fits(g)) continue;
    cpu::ConvScratch<double> ws;
    std::vector<double> y(y_size(g));
    auto loss = [&] {
      if (winograd)
        cpu::winograd_conv3x3_forward(g, x.data(), w.data(), b.data(), y.data(), ws, nullptr, tile);
      else
        cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y.data(), ws);
      return test::dot(r, y);
    };
    std::vector<double> dx(x.size(), -7.0), dw(w.size(), 0.0), db(b.size(), 0.0);
    if (winograd)
      cpu::winograd_conv3x3_backward(g, x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data(), ws, nullptr,
                                     tile);
    else
      cpu::conv2d_backward(g, x.data(), w.data(), r.data(), dw.data(), db.data(), dx.data(), ws);

    // L is linear in each of x, w and b, so a wide step has no truncation
    // error, and it keeps the forward's rounding (Winograd's transforms round
    // more than a direct sum: 4e-14 of 33) small against the step.
    const double h = 0.1;
    EXPECT_LT(max_rel_err(dx, test::numeric_grad(x, loss, h)), 1e-6) << "dx, winograd tile " << tile;
    EXPECT_LT(max_rel_err(dw, test::numeric_grad(w, loss, h)), 1e-6) << "dw, winograd tile " << tile;
    EXPECT_LT(max_rel_err(db, test::numeric_grad(b, loss, h)), 1e-6) << "db, winograd tile " << tile;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvGrad,
    ::testing::Values(ConvCase{2, 1, 6, 6, 3, 3, 1, 0},     // LeNet conv1's form
                      ConvCase{2, 3, 9, 9, 2, 5, 1, 0},     // conv2's form: C > 1, k = 5
                      ConvCase{3, 2, 7, 5, 4, 3, 1, 1},     // padding, non-square
                      ConvCase{1, 2, 5, 19, 3, 3, 1, 1},    // rows wider than a vector
                      ConvCase{2, 2, 7, 7, 3, 3, 2, 1},     // stride 2
                      ConvCase{1, 1, 4, 4, 2, 1, 1, 0},     // 1x1 kernel
                      // Winograd's form (winograd_fits): odd and even
                      // sides, the last tile half outside; one pixel wide.
                      ConvCase{2, 16, 7, 5, 16, 3, 1, 1}, ConvCase{1, 17, 4, 4, 20, 3, 1, 1},
                      ConvCase{2, 16, 3, 1, 18, 3, 1, 1}, ConvCase{1, 16, 6, 9, 17, 3, 1, 1}));

TEST(Conv2d, WinogradTakesTheLayersItShould) {
  EXPECT_TRUE(cpu::winograd_fits(conv_geom(2, 16, 7, 5, 16, 3, 1, 1)));
  EXPECT_TRUE(cpu::winograd_fits(conv_geom(2, 512, 4, 4, 512, 3, 1, 1)));   // resnet18's last block
  EXPECT_FALSE(cpu::winograd_fits(conv_geom(2, 1, 28, 28, 64, 3, 1, 1)));   // its stem
  EXPECT_FALSE(cpu::winograd_fits(conv_geom(2, 64, 28, 28, 128, 3, 2, 1)));  // stride 2
  EXPECT_FALSE(cpu::winograd_fits(conv_geom(2, 64, 28, 28, 128, 1, 1, 0)));  // 1x1
  EXPECT_FALSE(cpu::winograd_fits(conv_geom(2, 16, 13, 13, 50, 5, 1, 0)));   // 5x5
  EXPECT_FALSE(cpu::winograd_applies(conv_geom(256, 1, 28, 28, 64, 3, 1, 1)));  // the stem at any batch
  // Enough 2x2 output blocks to repay the weights' transforms (64): the last
  // block's 4x4 images have 4 each, its 7x7 ones 16, 14x14 ones 49.
  EXPECT_FALSE(cpu::winograd_applies(conv_geom(8, 512, 4, 4, 512, 3, 1, 1)));
  EXPECT_FALSE(cpu::winograd_applies(conv_geom(15, 512, 4, 4, 512, 3, 1, 1)));
  EXPECT_TRUE(cpu::winograd_applies(conv_geom(16, 512, 4, 4, 512, 3, 1, 1)));
  EXPECT_FALSE(cpu::winograd_applies(conv_geom(3, 256, 7, 7, 256, 3, 1, 1)));
  EXPECT_TRUE(cpu::winograd_applies(conv_geom(4, 256, 7, 7, 256, 3, 1, 1)));
  EXPECT_FALSE(cpu::winograd_applies(conv_geom(1, 128, 14, 14, 128, 3, 1, 1)));
  EXPECT_TRUE(cpu::winograd_applies(conv_geom(1, 64, 28, 28, 64, 3, 1, 1)));  // 196 blocks an image
  // F(4x4)'s 36 matrices from 96 blocks on, F(2x2)'s 16 below.
  EXPECT_EQ(cpu::winograd_tile(conv_geom(16, 512, 4, 4, 512, 3, 1, 1)), 2);
  EXPECT_EQ(cpu::winograd_tile(conv_geom(23, 512, 4, 4, 512, 3, 1, 1)), 2);
  EXPECT_EQ(cpu::winograd_tile(conv_geom(24, 512, 4, 4, 512, 3, 1, 1)), 4);
  EXPECT_EQ(cpu::winograd_tile(conv_geom(4, 256, 7, 7, 256, 3, 1, 1)), 2);
  EXPECT_EQ(cpu::winograd_tile(conv_geom(8, 256, 7, 7, 256, 3, 1, 1)), 4);
  EXPECT_EQ(cpu::winograd_tile(conv_geom(2, 128, 14, 14, 128, 3, 1, 1)), 4);
  // Micro-shards sharing one transform of the kernels: from 32 blocks
  // (--deterministic's 8 images of the last block), and wherever a call
  // alone takes Winograd's path.
  EXPECT_TRUE(cpu::winograd_applies_to_shards(conv_geom(8, 512, 4, 4, 512, 3, 1, 1)));
  EXPECT_FALSE(cpu::winograd_applies_to_shards(conv_geom(7, 512, 4, 4, 512, 3, 1, 1)));
  EXPECT_FALSE(cpu::winograd_applies_to_shards(conv_geom(8, 512, 4, 4, 512, 3, 2, 1)));
  EXPECT_FALSE(cpu::winograd_applies_to_shards(conv_geom(64, 1, 28, 28, 64, 3, 1, 1)));
  for (const ConvGeom& g : {conv_geom(16, 512, 4, 4, 512, 3, 1, 1), conv_geom(4, 256, 7, 7, 256, 3, 1, 1),
                            conv_geom(1, 64, 28, 28, 64, 3, 1, 1), conv_geom(2, 128, 14, 14, 128, 3, 1, 1)})
    EXPECT_TRUE(cpu::winograd_applies_to_shards(g)) << g.batch << " images of " << g.in_c << " channels";
}

// Winograd's chunks (images side by side in the GEMMs) and threads give each
// image what it gets alone, to rounding (the GEMMs' shapes differ), and the
// float path is close to the double one.
TEST(Conv2d, WinogradChunksThreadsAndFloat) {
  const ConvGeom g = conv_geom(40, 32, 7, 7, 48, 3, 1, 1);
  ASSERT_TRUE(cpu::winograd_applies(g));
  const auto x = random_vec(x_size(g), 30), w = random_vec(w_size(g), 31, 0.1),
             b = random_vec(size_t(g.out_c), 32), dy = random_vec(y_size(g), 33);
  ConvGeom one = g;
  one.batch = 1;
  const size_t xi = x_size(one), yi = y_size(one);
  std::vector<double> y1(y_size(g)), dx1(x.size()), dw1(w.size(), 0.0), db1(b.size(), 0.0);
  cpu::ConvScratch<double> ws1;
  for (int n = 0; n < g.batch; ++n) {  // each image alone on Winograd's path
    cpu::winograd_conv3x3_forward(one, x.data() + n * xi, w.data(), b.data(), y1.data() + n * yi, ws1);
    cpu::winograd_conv3x3_backward(one, x.data() + n * xi, w.data(), dy.data() + n * yi, dw1.data(), db1.data(),
                                   dx1.data() + n * xi, ws1);
  }
  EXPECT_LT(test::scaled_err(y1, conv_direct(g, x, w, b)), 1e-14);
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    cpu::ConvScratch<double> ws;
    std::vector<double> y(y1.size()), dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
    cpu::conv2d_forward(g, x.data(), w.data(), b.data(), y.data(), ws, &pool);
    cpu::conv2d_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), ws, &pool);
    EXPECT_LT(test::scaled_err(y, y1), 1e-13) << threads << " threads";
    EXPECT_LT(test::scaled_err(dx, dx1), 1e-13) << threads << " threads";
    EXPECT_LT(test::scaled_err(dw, dw1), 1e-13) << threads << " threads";
  }

  GraphBuilder gb("conv", {32, 7, 7}, true);
  const Graph graph = gb.finish(gb.conv("conv", gb.input(), 48, 3, 1, 1));
  const auto r = test::run_cpu_kernel(graph, 0, g.batch, {test::to_float(x)}, {test::to_float(w), test::to_float(b)},
                                      test::to_float(dy));
  EXPECT_LT(test::scaled_err(r.y, y1), 1e-5);
  EXPECT_LT(test::scaled_err(r.dx[0], dx1), 1e-5);
  EXPECT_LT(test::scaled_err(r.dp[0], dw1), 1e-5);
}

// How far each tile size's float path is from the exact (double) result, on
// a layer of resnet18's second block: im2col's GEMM alone rounds to about
// 5e-7 of the outputs' scale here, F(2x2) to about as much, F(4x4) to 1e-5
// (measured 4e-6 to 9e-6). A transform that rounds worse than its points
// allow shows here while the double checks above still pass.
TEST(Conv2d, WinogradFloatRoundingPerTileSize) {
  const ConvGeom g = conv_geom(2, 128, 14, 14, 128, 3, 1, 1);
  const auto x = random_vec(x_size(g), 40), w = random_vec(w_size(g), 41, 0.05),
             b = random_vec(size_t(g.out_c), 42), dy = random_vec(y_size(g), 43);
  std::vector<double> y(y_size(g)), dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  cpu::ConvScratch<double> wsd;
  cpu::winograd_conv3x3_forward(g, x.data(), w.data(), b.data(), y.data(), wsd, nullptr, 2);
  cpu::winograd_conv3x3_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), wsd, nullptr, 2);
  ASSERT_LT(test::scaled_err(y, conv_direct(g, x, w, b)), 1e-14);
  const auto xf = test::to_float(x), wf = test::to_float(w), bf = test::to_float(b), dyf = test::to_float(dy);
  for (const int tile : {2, 4}) {
    cpu::ConvScratch<float> ws;
    std::vector<float> yf(y.size()), dxf(x.size()), dwf(w.size(), 0.f), dbf(b.size(), 0.f);
    cpu::winograd_conv3x3_forward(g, xf.data(), wf.data(), bf.data(), yf.data(), ws, nullptr, tile);
    cpu::winograd_conv3x3_backward(g, xf.data(), wf.data(), dyf.data(), dwf.data(), dbf.data(), dxf.data(), ws,
                                   nullptr, tile);
    const double bound = tile == 2 ? 2e-6 : 3e-5;
    EXPECT_LT(test::scaled_err(yf, y), bound) << "tiles of " << tile;
    EXPECT_LT(test::scaled_err(dxf, dx), bound) << "tiles of " << tile;
    EXPECT_LT(test::scaled_err(dwf, dw), bound) << "tiles of " << tile;
    EXPECT_LT(test::scaled_err(dbf, db), 1e-6) << "tiles of " << tile;
  }
}

// Kernels transformed once (winograd_transform_weights, as the CPU device
// does for --deterministic's micro-shards) give each call exactly what it
// gets transforming them itself, with either tile size, split over threads
// or not.
TEST(Conv2d, WinogradWithKernelsTransformedOnceIsBitwiseTheSame) {
  const ConvGeom g = conv_geom(3, 24, 7, 6, 20, 3, 1, 1);
  const auto x = test::to_float(random_vec(x_size(g), 50)), w = test::to_float(random_vec(w_size(g), 51)),
             b = test::to_float(random_vec(size_t(g.out_c), 52)), dy = test::to_float(random_vec(y_size(g), 53));
  ThreadPool pool(3);
  for (const int tile : {2, 4}) {
    cpu::ConvScratch<float> ws;
    std::vector<float> y(y_size(g)), dx(x.size()), dw(w.size(), 0.f), db(b.size(), 0.f);
    cpu::winograd_conv3x3_forward(g, x.data(), w.data(), b.data(), y.data(), ws, nullptr, tile);
    cpu::winograd_conv3x3_backward(g, x.data(), w.data(), dy.data(), dw.data(), db.data(), dx.data(), ws, nullptr,
                                   tile);
    std::vector<float> u, ut;
    cpu::winograd_transform_weights(g, w.data(), /*turned=*/false, tile, u, &pool);
    cpu::winograd_transform_weights(g, w.data(), /*turned=*/true, tile, ut);
    std::vector<float> y2(y.size()), dx2(x.size()), dw2(w.size(), 0.f), db2(b.size(), 0.f);
    cpu::winograd_conv3x3_forward(g, x.data(), w.data(), b.data(), y2.data(), ws, nullptr, tile, u.data());
    cpu::winograd_conv3x3_backward(g, x.data(), w.data(), dy.data(), dw2.data(), db2.data(), dx2.data(), ws, nullptr,
                                   tile, ut.data());
    EXPECT_EQ(y, y2) << "tiles of " << tile;
    EXPECT_EQ(dx, dx2) << "tiles of " << tile;
    EXPECT_EQ(dw, dw2) << "tiles of " << tile;
    EXPECT_EQ(db, db2) << "tiles of " << tile;
  }
}

// A batch big enough for several im2col chunks must equal image-by-image.
TEST(Conv2d, ChunkedBatchAndThreadsEqualSingleImages) {
  // conv2's form, 81 pixels an image: chunks of 13 images (kConvMinColumns),
  // 13 + 13 + 13 + 1 on one thread or on three.
  const ConvGeom g = conv_geom(40, 6, 13, 13, 50, 5, 1, 0);
  ASSERT_EQ(cpu::conv_chunk_images<double>(g, 1), 13);
  ASSERT_EQ(cpu::conv_chunk_images<double>(g, 3), 13);
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

// im2col and col2im store short rows as whole vectors whose lanes past a row
// land on the next (Note [whole-vector rows] in core/simd.hpp): each must
// still write exactly its nb images' columns, whatever lies around them.
TEST(Conv2d, Im2colAndCol2imWriteOnlyTheirImages) {
  const double kUntouched = -1234.5;
  for (const ConvGeom g : {conv_geom(3, 2, 4, 3, 1, 3, 1, 1),     // 3 wide: many rows a vector
                           conv_geom(3, 1, 5, 1, 1, 1, 1, 0),     // 1 wide
                           conv_geom(2, 2, 13, 13, 1, 5, 1, 0),   // LeNet conv2's 9 wide
                           conv_geom(2, 1, 28, 28, 1, 3, 1, 0),   // conv1's 26 wide
                           conv_geom(2, 1, 9, 19, 1, 3, 1, 2)}) {  // padding, 21 wide
    const int OHW = g.out_h() * g.out_w(), rows = g.in_c * g.k * g.k;
    for (int nb = 1; nb <= g.batch; ++nb) {
      SCOPED_TRACE(testing::Message() << "in " << g.in_c << "x" << g.in_h << "x" << g.in_w << " k " << g.k
                                      << " pad " << g.pad << ", " << nb << " images");
      const auto x = random_vec(size_t(nb) * g.in_c * g.in_h * g.in_w, 20);
      // Rows one column apart and with a gap: nothing is aligned.
      for (const int64_t ld : {int64_t(nb) * OHW, int64_t(nb) * OHW + 3}) {
        std::vector<double> col(size_t(rows) * ld + 40, kUntouched);
        cpu::im2col(g, x.data(), nb, ld, col.data());
        for (int r = 0; r < rows; ++r) {
          const int c = r / (g.k * g.k), kh = r / g.k % g.k, kw = r % g.k;
          for (int64_t j = 0; j < ld; ++j) {
            const double got = col[size_t(r * ld + j)];
            if (j >= int64_t(nb) * OHW) {
              ASSERT_EQ(got, kUntouched) << "row " << r << " column " << j;
              continue;
            }
            const int i = int(j / OHW), oh = int(j % OHW) / g.out_w(), ow = int(j % OHW) % g.out_w();
            const int ih = oh - g.pad + kh, iw = ow - g.pad + kw;
            const bool inside = ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w;
            const double want = inside ? x[((size_t(i) * g.in_c + c) * g.in_h + ih) * g.in_w + iw] : 0.0;
            ASSERT_EQ(got, want) << "row " << r << " column " << j;
          }
        }
        for (size_t j = size_t(rows) * ld; j < col.size(); ++j) ASSERT_EQ(col[j], kUntouched);
      }
      // col2im over a dx with room after it: its nb images, nothing past.
      const int64_t ld = int64_t(nb) * OHW + 3;
      const auto col = random_vec(size_t(rows) * ld, 21);
      const size_t dx_size = size_t(nb) * g.in_c * g.in_h * g.in_w;
      std::vector<double> dx(dx_size + 40, kUntouched), want(dx_size, 0.0);
      for (int r = 0; r < rows; ++r) {
        const int c = r / (g.k * g.k), kh = r / g.k % g.k, kw = r % g.k;
        for (int64_t j = 0; j < int64_t(nb) * OHW; ++j) {
          const int i = int(j / OHW), oh = int(j % OHW) / g.out_w(), ow = int(j % OHW) % g.out_w();
          const int ih = oh - g.pad + kh, iw = ow - g.pad + kw;
          if (ih >= 0 && ih < g.in_h && iw >= 0 && iw < g.in_w)
            want[((size_t(i) * g.in_c + c) * g.in_h + ih) * g.in_w + iw] += col[size_t(r * ld + j)];
        }
      }
      cpu::col2im(g, col.data(), nb, ld, dx.data());
      for (size_t j = 0; j < dx_size; ++j) ASSERT_NEAR(dx[j], want[j], 1e-12) << "dx " << j;
      for (size_t j = dx_size; j < dx.size(); ++j) ASSERT_EQ(dx[j], kUntouched) << "past dx, " << j;
    }
  }
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

// The float kernel (what models run) agrees with the double one.
TEST(Conv2d, FloatKernelMatchesDoubleKernel) {
  const ConvGeom g = conv_geom(9, 20, 13, 13, 50, 5, 1, 0);  // several float chunks too
  const auto xd = random_vec(x_size(g), 15), wd = random_vec(w_size(g), 16, 0.1),
             bd = random_vec(50, 17), dyd = random_vec(y_size(g), 18);
  cpu::ConvScratch<double> ws;
  std::vector<double> yd(y_size(g)), dxd(xd.size()), dwd(wd.size(), 0.0), dbd(50, 0.0);
  cpu::conv2d_forward(g, xd.data(), wd.data(), bd.data(), yd.data(), ws);
  cpu::conv2d_backward(g, xd.data(), wd.data(), dyd.data(), dwd.data(), dbd.data(), dxd.data(), ws);

  GraphBuilder gb("conv", {20, 13, 13}, false);
  const Graph graph = gb.finish(gb.conv("conv2", gb.input(), 50, 5));
  const auto r = test::run_cpu_kernel(graph, 0, g.batch, {test::to_float(xd)}, {test::to_float(wd), test::to_float(bd)},
                                      test::to_float(dyd));
  const auto &y = r.y, &dx = r.dx[0], &dw = r.dp[0], &db = r.dp[1];
  EXPECT_LT(test::scaled_err(y, yd), 1e-5);
  EXPECT_LT(test::scaled_err(dx, dxd), 1e-5);
  EXPECT_LT(test::scaled_err(dw, dwd), 1e-5);
  EXPECT_LT(test::scaled_err(db, dbd), 1e-5);
}

TEST(Conv2d, BadGeometryIsNamed) {
  GraphBuilder gb("m", {1, 4, 4}, false);
  try {
    gb.conv("big", gb.input(), 2, 5);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op big"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::nn
