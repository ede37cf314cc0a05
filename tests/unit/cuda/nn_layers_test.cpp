// Every op kind's GPU kernels against the CPU's (the reference) on the same
// random inputs, parameters and buffers: forward, the buffers it moves, dx,
// and parameter gradients that must be ADDED to what the gradient buffers
// held (Note [gradient accumulation] in nn/device.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "ddp/core/error.hpp"      // ddp::Error
#include "ddp/nn/cuda/device.hpp"  // make_cuda_device
#include "ddp/nn/device.hpp"       // make_cpu_device, Kernel, OpArgs
#include "ddp/nn/graph.hpp"        // GraphBuilder
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::normal;
using nn_cuda_test::on_grid;

class CudaLayers : public nn_cuda_test::GpuTest {
 protected:
  // The GPU's kernel in `layout` (Note [channels last]): its inputs, output
  // and their gradients transposed at the test's edges, the CPU's NCHW.
  void check(const Graph& g, size_t op, int batch, Layout layout = Layout::NCHW);
  // check() with the proven kernels, then with --gpu-kernels next's
  // (BatchNorm's split sums, Note [batch norm sums]; convolutions through
  // cuDNN's graph API, Note [graph engines]).
  template <typename Check>
  void both_kernels(Check&& check_all) {
    for (const bool next : {false, true}) {
      SCOPED_TRACE(next ? "--gpu-kernels next" : "--gpu-kernels proven");
      ctx().set_next_kernels(next);
      check_all();
    }
    ctx().set_next_kernels(false);
  }
};

// Convolution inputs and parameters on a grid (nn_cuda_test::on_grid), the
// bias half a step off it: conv + bias is then exact and never 0, so relu's
// mask is the same on both devices whatever cuDNN's summation order. Other
// ops get plain normal values.
//
// A convolution's parameter gradients sum the incoming gradient (normal
// values, off the grid) over batch x positions, and cuDNN may take a
// transform algorithm (FFT, Winograd) for it, which rounds more than a plain
// sum: LeNet's conv2 at batch 64 was 1.2e-3 of its largest weight gradient
// off the CPU's on an H200 (2026-11-26), where forward and dx agreed to 1e-4.
// So those are held to 5e-3; a wrong index or a missed term moves an entry
// by its whole size.
constexpr double kConvParamGradTol = 5e-3;

void CudaLayers::check(const Graph& g, size_t op_index, int batch, Layout layout) {
  const Op& op = g.ops[op_index];
  SCOPED_TRACE(op.name + " batch " + std::to_string(batch) + ", " + to_string(layout));
  const bool conv = op.kind == OpKind::Conv2d || op.kind == OpKind::ConvReluPool;
  auto cpu_dev = make_cpu_device(2);
  auto gpu_dev = make_cuda_device(ctx(), CudaDeviceOptions{layout});
  // A value's batch between the CPU's layout and the GPU's.
  auto to_gpu = [&](const std::vector<float>& v, Shape s) { return nn_cuda_test::to_layout(v, batch, s, layout); };
  auto from_gpu = [&](const std::vector<float>& v, Shape s) { return nn_cuda_test::from_layout(v, batch, s, layout); };
  auto cpu = cpu_dev->kernel(g, op_index, nullptr);
  auto gpu = gpu_dev->kernel(g, op_index, nullptr);

  // Parameters, gradients pre-filled with nonzero values, buffers.
  std::vector<std::vector<float>> p, dp, buf;
  for (size_t k : g.op_params[op_index]) {
    const TensorInfo& t = g.params[k];
    const bool bias = t.name.size() > 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
    if (conv)
      p.push_back(bias ? on_grid(t.numel, 100 + k, 1.0f / 32, 8, 1.0f / 64) : on_grid(t.numel, 100 + k, 1.0f / 8, 4));
    else
      p.push_back(normal(t.numel, 100 + k, bias ? 0.5 : 0.1));
    dp.push_back(normal(t.numel, 200 + k));
  }
  for (size_t k : g.op_buffers[op_index]) {
    buf.push_back(normal(g.buffers[k].numel, 300 + k, 0.2));
    if (g.buffers[k].name.find("running_var") != std::string::npos)
      for (float& v : buf.back()) v = 1.0f + std::abs(v);
  }
  std::vector<std::unique_ptr<DeviceArray<float>>> gp, gdp, gbuf;
  OpArgs ca, ga;
  ca.batch = ga.batch = batch;
  for (size_t i = 0; i < p.size(); ++i) {
    gp.push_back(std::make_unique<DeviceArray<float>>(ctx(), p[i]));
    gdp.push_back(std::make_unique<DeviceArray<float>>(ctx(), dp[i]));
    ca.p.push_back(p[i].data());
    ca.dp.push_back(dp[i].data());
    ga.p.push_back(gp[i]->get());
    ga.dp.push_back(gdp[i]->get());
  }
  for (size_t i = 0; i < buf.size(); ++i) {
    gbuf.push_back(std::make_unique<DeviceArray<float>>(ctx(), buf[i]));
    ca.buf.push_back(buf[i].data());
    ga.buf.push_back(gbuf[i]->get());
  }
  int64_t cpu_counter = 0, gpu_counter = 0;
  if (op.counter) {
    ca.counter = &cpu_counter;
    ga.counter = &gpu_counter;
  }

  // Inputs; y and dx start nonzero: both must be overwritten. Pool memory's
  // contents are undefined and may be zeros, which would let a y or dx that
  // is added to (beta = 1) or only partly written pass.
  std::vector<std::vector<float>> x, dx;
  std::vector<std::unique_ptr<DeviceArray<float>>> gx, gdx;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const size_t n = size_t(batch) * size_t(g.values[size_t(op.inputs[i])].numel());
    x.push_back(conv ? on_grid(n, 1 + i, 0.25f, 4) : normal(n, 1 + i));
    dx.push_back(std::vector<float>(n));
    gx.push_back(std::make_unique<DeviceArray<float>>(ctx(), to_gpu(x.back(), g.values[size_t(op.inputs[i])])));
    gdx.push_back(std::make_unique<DeviceArray<float>>(ctx(), normal(n, 4 + i)));
    ca.x.push_back(x.back().data());
    ga.x.push_back(gx.back()->get());
  }
  const size_t ny = size_t(batch) * size_t(op.out.numel());
  std::vector<float> y(ny);
  DeviceArray<float> gy(ctx(), normal(ny, 3)), gdy(ctx(), normal(ny, 2));
  const std::vector<float> dy = from_gpu(gdy.download(), op.out);
  ca.y = y.data();
  ga.y = gy.get();

  cpu->forward(ca);
  gpu->forward(ga);
  EXPECT_TRUE(agrees(from_gpu(gy.download(), op.out), y)) << "forward";
  for (size_t i = 0; i < buf.size(); ++i) EXPECT_TRUE(agrees(gbuf[i]->download(), buf[i])) << "buffer " << i;
  EXPECT_EQ(gpu_counter, cpu_counter);

  std::vector<float*> cdx, gdxp, none(op.inputs.size(), nullptr);
  for (size_t i = 0; i < x.size(); ++i) {
    cdx.push_back(dx[i].data());
    gdxp.push_back(gdx[i]->get());
  }
  cpu->backward(ca, dy.data(), cdx);
  gpu->backward(ga, gdy.get(), gdxp);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_TRUE(agrees(from_gpu(gdx[i]->download(), g.values[size_t(op.inputs[i])]), dx[i])) << "dx " << i;
  const double grad_tol = conv ? kConvParamGradTol : 1e-4;
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(agrees(gdp[i]->download(), dp[i], grad_tol)) << "grad " << i;

  // Once more without dx (the first op's case): the gradients add up again.
  cpu->backward(ca, dy.data(), none);
  gpu->backward(ga, gdy.get(), none);
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_TRUE(agrees(gdp[i]->download(), dp[i], grad_tol)) << "grad " << i << ", again";

  if (op.kind == OpKind::BatchNorm2d) {  // eval mode: the running statistics
    ca.mode = ga.mode = Mode::Eval;
    cpu->forward(ca);
    gpu->forward(ga);
    EXPECT_TRUE(agrees(from_gpu(gy.download(), op.out), y)) << "eval forward";
    EXPECT_EQ(gpu_counter, cpu_counter) << "eval counts no batch";
  }
}

// A graph whose op 0 is the one built by add(builder, input).
template <typename Add>
Graph one_op(Shape in, Add&& add) {
  GraphBuilder b("test", in, /*pytorch_init=*/true);
  const int y = add(b, b.input());
  return b.finish(b.flatten("flatten_out", y));
}

TEST_F(CudaLayers, ConvReluPoolLenetConv1) {
  const Graph g = one_op({1, 28, 28}, [](GraphBuilder& b, int x) { return b.conv_relu_pool("conv1", x, 20, 3); });
  both_kernels([&] {
    for (int batch : {7, 64}) check(g, 0, batch);
  });
}

TEST_F(CudaLayers, ConvReluPoolLenetConv2) {
  const Graph g = one_op({20, 13, 13}, [](GraphBuilder& b, int x) { return b.conv_relu_pool("conv2", x, 50, 5); });
  both_kernels([&] {
    for (int batch : {7, 64}) check(g, 0, batch);
  });
}

TEST_F(CudaLayers, Conv2dPadded) {
  const Graph g = one_op({3, 12, 10}, [](GraphBuilder& b, int x) { return b.conv("conv", x, 8, 3, 1, 1); });
  both_kernels([&] {
    for (int batch : {7, 64}) check(g, 0, batch);
  });
}

// ResNet-18's strided convolutions: 3x3 padded, and the 1x1 projection.
TEST_F(CudaLayers, Conv2dStride2) {
  const Graph g = one_op({4, 11, 9}, [](GraphBuilder& b, int x) { return b.conv("conv_s2", x, 6, 3, 2, 1); });
  const Graph p = one_op({64, 7, 7}, [](GraphBuilder& b, int x) { return b.conv("conv3", x, 128, 1, 2, 0); });
  both_kernels([&] {
    for (int batch : {5, 32}) check(g, 0, batch);
    for (int batch : {5, 32}) check(p, 0, batch);
  });
}

TEST_F(CudaLayers, AvgPool2dOddSizes) {
  const Graph g = one_op({5, 9, 7}, [](GraphBuilder& b, int x) { return b.avg_pool2("pool_odd", x); });
  for (int batch : {7, 64}) check(g, 0, batch);
}

TEST_F(CudaLayers, GlobalAvgPool) {
  const Graph g = one_op({512, 4, 4}, [](GraphBuilder& b, int x) { return b.global_avg_pool("gap", x); });
  for (int batch : {7, 64}) check(g, 0, batch);
}

TEST_F(CudaLayers, ReLU) {
  const Graph g = one_op({6, 5, 7}, [](GraphBuilder& b, int x) { return b.relu("relu", x); });
  for (int batch : {7, 64}) check(g, 0, batch);
}

// Both sums: one block a channel (--gpu-kernels proven), and runs of many
// blocks a channel (next, Note [batch norm sums]); 16 x 28 x 28 at batch 32
// is 25088 values a channel, cut into several runs.
TEST_F(CudaLayers, BatchNorm2dTrainAndEval) {
  both_kernels([&] {
    for (const Shape& in : {Shape{64, 7, 7}, Shape{16, 28, 28}}) {
      const Graph g = one_op(in, [](GraphBuilder& b, int x) { return b.batch_norm("bn", x); });
      for (int batch : {3, 32}) check(g, 0, batch);
    }
  });
}

// The residual add, with and without its ReLU (op 1: it reads the input and
// the ReLU's output, two values).
TEST_F(CudaLayers, AddWithAndWithoutRelu) {
  for (const bool relu : {false, true}) {
    const Graph g = one_op({8, 6, 6}, [relu](GraphBuilder& b, int x) { return b.add("add", x, b.relu("r", x), relu); });
    for (int batch : {3, 32}) check(g, 1, batch);
  }
}

TEST_F(CudaLayers, LinearLenetFc1OnImageShape) {
  const Graph g = one_op({50, 4, 4}, [](GraphBuilder& b, int x) { return b.linear("fc1", x, 128); });
  for (int batch : {7, 64}) check(g, 0, batch);
}

TEST_F(CudaLayers, LinearLenetFc2) {
  const Graph g = one_op({128, 1, 1}, [](GraphBuilder& b, int x) { return b.linear("fc2", x, 10); });
  for (int batch : {7, 64}) check(g, 0, batch);
}

// Note [channels last]: every op kind with an NHWC kernel, in NHWC, against
// the CPU: ResNet-18's convolutions (3x3 padded, strided, the 1x1
// projection), odd sides and channel counts that are not multiples of 8
// (nor of the sums' 32-channel groups), BatchNorm in both modes, the global
// pool, the residual add; legacy and graph-API convolutions alike.
TEST_F(CudaLayers, ChannelsLastAgainstTheCpu) {
  const Layout nhwc = Layout::NHWC;
  const Graph padded = one_op({3, 12, 10}, [](GraphBuilder& b, int x) { return b.conv("conv", x, 8, 3, 1, 1); });
  const Graph wide = one_op({64, 14, 14}, [](GraphBuilder& b, int x) { return b.conv("conv", x, 64, 3, 1, 1); });
  const Graph strided = one_op({4, 11, 9}, [](GraphBuilder& b, int x) { return b.conv("conv_s2", x, 6, 3, 2, 1); });
  const Graph proj = one_op({64, 7, 7}, [](GraphBuilder& b, int x) { return b.conv("conv3", x, 128, 1, 2, 0); });
  const Graph odd = one_op({5, 9, 7}, [](GraphBuilder& b, int x) { return b.conv("conv_odd", x, 37, 3, 1, 1); });
  both_kernels([&] {
    for (const Graph* g : {&padded, &wide, &strided, &proj, &odd})
      for (int batch : {3, 16}) check(*g, 0, batch, nhwc);
    for (const Shape& in : {Shape{64, 7, 7}, Shape{16, 28, 28}, Shape{37, 5, 3}}) {
      const Graph g = one_op(in, [](GraphBuilder& b, int x) { return b.batch_norm("bn", x); });
      for (int batch : {3, 32}) check(g, 0, batch, nhwc);
    }
  });
  for (const Shape& in : {Shape{512, 4, 4}, Shape{37, 3, 5}}) {
    const Graph g = one_op(in, [](GraphBuilder& b, int x) { return b.global_avg_pool("gap", x); });
    for (int batch : {7, 64}) check(g, 0, batch, nhwc);
  }
  const Graph add = one_op({8, 6, 6}, [](GraphBuilder& b, int x) { return b.add("add", x, b.relu("r", x), true); });
  for (int batch : {3, 32}) {
    check(add, 0, batch, nhwc);
    check(add, 1, batch, nhwc);
  }
}

TEST_F(CudaLayers, AnOpWithoutAnNhwcKernelIsRefusedInNhwc) {
  const Graph g = one_op({20, 12, 12}, [](GraphBuilder& b, int x) { return b.avg_pool2("pool", x); });
  EXPECT_THROW(make_cuda_device(ctx(), CudaDeviceOptions{Layout::NHWC})->kernel(g, 0, nullptr), Error);
}

TEST_F(CudaLayers, BackwardBeforeForwardAtThatBatchIsAnError) {
  const Graph g = one_op({1, 28, 28}, [](GraphBuilder& b, int x) { return b.conv_relu_pool("conv1", x, 20, 3); });
  auto dev = make_cuda_device(ctx());
  auto k = dev->kernel(g, 0, nullptr);
  DeviceArray<float> w(ctx(), 20 * 9), b(ctx(), 20), dw(ctx(), 20 * 9), db(ctx(), 20);
  DeviceArray<float> x(ctx(), 4 * 784), y(ctx(), 4 * 20 * 13 * 13), dy(ctx(), 4 * 20 * 13 * 13);
  OpArgs a;
  a.batch = 4;
  a.x = {x.get()};
  a.y = y.get();
  a.p = {w.get(), b.get()};
  a.dp = {dw.get(), db.get()};
  EXPECT_THROW(k->backward(a, dy.get(), {nullptr}), Error);
}

}  // namespace
}  // namespace ddp::nn
