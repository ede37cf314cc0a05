// Every GPU layer against its CPU twin (the reference, layers.hpp) on the same
// random inputs and parameters: forward, dx, and parameter gradients that must
// be ADDED to what the gradient buffers held (Note [gradient accumulation]).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ddp/core/error.hpp"     // ddp::Error
#include "ddp/nn/cuda_model.hpp"  // make_cuda_layer
#include "ddp/nn/model.hpp"       // LayerSpec, make_layer
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::normal;
using nn_cuda_test::on_grid;
using nn_cuda_test::to_host;

class CudaLayers : public nn_cuda_test::GpuTest {
 protected:
  void check(const LayerSpec& spec, int batch);
};

// Convolution inputs and parameters on a grid (nn_cuda_test::on_grid), the
// bias half a step off it: conv + bias is then exact and never 0, so relu's
// mask is the same on both devices whatever cuDNN's summation order. Other
// layers get plain normal values.
void CudaLayers::check(const LayerSpec& spec, int batch) {
  SCOPED_TRACE(spec.name + " batch " + std::to_string(batch));
  const bool conv = spec.kind == LayerKind::Conv2d || spec.kind == LayerKind::ConvReluPool;
  std::unique_ptr<Layer> cpu = make_layer(spec);
  std::unique_ptr<Layer> gpu = make_cuda_layer(spec, ctx());
  const Shape out = cpu->output_shape(spec.in);
  ASSERT_TRUE(gpu->output_shape(spec.in) == out);
  ASSERT_EQ(gpu->name(), cpu->name());
  const std::vector<ParamSpec> specs = cpu->param_specs(), gspecs = gpu->param_specs();
  ASSERT_EQ(gspecs.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(gspecs[i].name, specs[i].name);
    EXPECT_EQ(gspecs[i].shape, specs[i].shape);
    EXPECT_EQ(gspecs[i].init, specs[i].init);
  }

  // Parameters, and gradients pre-filled with nonzero values.
  std::vector<std::vector<float>> p, g;
  std::vector<std::unique_ptr<DeviceArray<float>>> dp, dg;
  std::vector<float*> pp, gp, dpp, dgp;
  for (size_t i = 0; i < specs.size(); ++i) {
    const size_t n = size_t(specs[i].numel());
    const bool bias = specs[i].name == "bias";
    if (conv)
      p.push_back(bias ? on_grid(n, 100 + i, 1.0f / 32, 8, 1.0f / 64) : on_grid(n, 100 + i, 1.0f / 8, 4));
    else
      p.push_back(normal(n, 100 + i, bias ? 0.5 : 0.1));
    g.push_back(normal(n, 200 + i));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    dp.push_back(std::make_unique<DeviceArray<float>>(ctx(), p[i]));
    dg.push_back(std::make_unique<DeviceArray<float>>(ctx(), g[i]));
    pp.push_back(p[i].data());
    gp.push_back(g[i].data());
    dpp.push_back(dp[i]->get());
    dgp.push_back(dg[i]->get());
  }
  cpu->bind(pp, gp);
  gpu->bind(dpp, dgp);

  const size_t nx = size_t(batch) * size_t(spec.in.numel()), ny = size_t(batch) * size_t(out.numel());
  const std::vector<float> x = conv ? on_grid(nx, 1, 0.25f, 4) : normal(nx, 1);
  const std::vector<float> dy = normal(ny, 2);
  // y and dx start nonzero: both must be overwritten. Pool memory's contents
  // are undefined and may be zeros, which would let a y or dx that is added
  // to (beta = 1) or only partly written pass.
  DeviceArray<float> gx(ctx(), x), gy(ctx(), normal(ny, 3)), gdy(ctx(), dy), gdx(ctx(), normal(nx, 4));

  std::vector<float> y(ny), dx(nx);
  cpu->forward(x.data(), batch, y.data());
  gpu->forward(gx.get(), batch, gy.get());
  EXPECT_TRUE(agrees(gy.download(), y)) << "forward";

  cpu->backward(x.data(), y.data(), dy.data(), batch, dx.data());
  gpu->backward(gx.get(), gy.get(), gdy.get(), batch, gdx.get());
  EXPECT_TRUE(agrees(gdx.download(), dx)) << "dx";
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_TRUE(agrees(dg[i]->download(), g[i])) << specs[i].name << " grad";

  // Once more without dx (the first layer's case): the gradients add up again.
  cpu->backward(x.data(), y.data(), dy.data(), batch, nullptr);
  gpu->backward(gx.get(), gy.get(), gdy.get(), batch, nullptr);
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_TRUE(agrees(dg[i]->download(), g[i])) << specs[i].name << " grad, second backward";
}

TEST_F(CudaLayers, ConvReluPoolLenetConv1) {
  for (int batch : {7, 64}) check({LayerKind::ConvReluPool, "conv1", {1, 28, 28}, 20, 3}, batch);
}

TEST_F(CudaLayers, ConvReluPoolLenetConv2) {
  for (int batch : {7, 64}) check({LayerKind::ConvReluPool, "conv2", {20, 13, 13}, 50, 5}, batch);
}

// Stride, padding, and a conv output of odd height (5x6: the last row feeds
// no pooled output).
TEST_F(CudaLayers, ConvReluPoolStridePadOddRows) {
  for (int batch : {3, 16}) check({LayerKind::ConvReluPool, "crp", {3, 10, 12}, 4, 3, 2, 1}, batch);
}

TEST_F(CudaLayers, Conv2d) {
  for (int batch : {7, 64}) check({LayerKind::Conv2d, "conv", {3, 12, 10}, 8, 3, 1, 1}, batch);
}

TEST_F(CudaLayers, Conv2dStride2) {
  for (int batch : {5, 32}) check({LayerKind::Conv2d, "conv_s2", {4, 11, 9}, 6, 3, 2, 0}, batch);
}

TEST_F(CudaLayers, AvgPool2d) {
  for (int batch : {7, 64}) check({LayerKind::AvgPool2d, "pool", {20, 26, 26}}, batch);
}

// Odd height and width: the last row and column get zero gradient.
TEST_F(CudaLayers, AvgPool2dOddSizes) {
  for (int batch : {7, 64}) check({LayerKind::AvgPool2d, "pool_odd", {5, 9, 7}}, batch);
}

TEST_F(CudaLayers, ReLU) {
  for (int batch : {7, 64}) check({LayerKind::ReLU, "relu", {6, 5, 7}}, batch);
}

TEST_F(CudaLayers, Flatten) {
  for (int batch : {7, 64}) check({LayerKind::Flatten, "flatten", {50, 4, 4}}, batch);
}

TEST_F(CudaLayers, LinearLenetFc1) {
  for (int batch : {7, 64}) check({LayerKind::Linear, "fc1", {800, 1, 1}, 128}, batch);
}

TEST_F(CudaLayers, LinearLenetFc2) {
  for (int batch : {7, 64}) check({LayerKind::Linear, "fc2", {128, 1, 1}, 10}, batch);
}

// A Linear fed an image shape reads it as its in_features, NCHW order.
TEST_F(CudaLayers, LinearOnImageShape) {
  for (int batch : {7, 64}) check({LayerKind::Linear, "fc_img", {50, 4, 4}, 128}, batch);
}

TEST_F(CudaLayers, BackwardBeforeForwardAtThatBatchIsAnError) {
  const LayerSpec spec{LayerKind::ConvReluPool, "conv1", {1, 28, 28}, 20, 3};
  std::unique_ptr<Layer> gpu = make_cuda_layer(spec, ctx());
  DeviceArray<float> w(ctx(), 20 * 9), b(ctx(), 20), dw(ctx(), 20 * 9), db(ctx(), 20);
  gpu->bind({w.get(), b.get()}, {dw.get(), db.get()});
  DeviceArray<float> x(ctx(), 4 * 784), dy(ctx(), 4 * 20 * 13 * 13);
  EXPECT_THROW(gpu->backward(x.get(), nullptr, dy.get(), 4, nullptr), Error);
}

}  // namespace
}  // namespace ddp::nn
