// BatchNorm's split sums over several micro-shards in one launch (Note
// [shards in one launch], nn/cuda/bn_plan.hpp): each micro-shard's sums are
// the bits of a launch of that micro-shard alone, in both layouts, forward
// (of x, and of (x - mean)^2) and backward (with and without a ReLU mask).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ddp/nn/cuda/kernels.hpp"  // CudaBatchNorm
#include "ddp/nn/graph.hpp"         // GraphBuilder
#include "nn_cuda_test_util.hpp"

namespace ddp::nn_cuda_test {
namespace {

using nn::Layout;

// A BatchNorm whose sums the test launches itself.
class SumProbe final : public nn::CudaBatchNorm {
 public:
  using CudaBatchNorm::CudaBatchNorm;
  using CudaBatchNorm::chan;
  using CudaBatchNorm::launch_sums;
  using CudaBatchNorm::param_grads_of_shards;
};

class CudaShardSums : public GpuTest {};

// One BatchNorm on inputs of shape in.
nn::Graph bn_graph(const nn::Shape& in) {
  nn::GraphBuilder b("bn", in, /*pytorch_init=*/true);
  return b.finish(b.batch_norm("bn", b.input()));
}

TEST_F(CudaShardSums, MicroShardsInOneLaunchAreEachLaunchsOwnBits) {
  // 40 channels (not a multiple of the NHWC blocks' 32), odd planes, and
  // micro-shards big enough to be cut into several runs a channel in both
  // layouts (NCHW: 12 x 33 x 31 values a channel, 6 runs of at least
  // kBnMinPerSplit).
  constexpr int kC = 40, kShards = 4, kImages = 12;
  const nn::Shape in{kC, 33, 31};
  const size_t image = size_t(in.numel()), n = size_t(kShards) * kImages * image;
  const nn::Graph g = bn_graph(in);
  DeviceArray<float> x(ctx(), normal(n, 1)), dy(ctx(), normal(n, 2)), relu(ctx(), normal(n, 3)),
      mean(ctx(), normal(kC, 4, 0.1));
  ctx().set_next_kernels(true);
  for (const Layout layout : {Layout::NCHW, Layout::NHWC}) {
    SumProbe bn(g.ops[0], ctx(), nullptr, layout);
    DeviceArray<double> together(ctx(), 2 * kC * kShards), alone(ctx(), 2 * kC * kShards);
    struct Case {
      const char* what;
      const float *mean, *dy, *relu_y;
    };
    const std::vector<Case> cases = {{"sum of x", nullptr, nullptr, nullptr},
                                     {"sum of (x - mean)^2", mean.get(), nullptr, nullptr},
                                     {"gradient sums", mean.get(), dy.get(), nullptr},
                                     {"gradient sums under a ReLU", mean.get(), dy.get(), relu.get()}};
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(layout == Layout::NHWC ? "NHWC, " : "NCHW, ") + c.what);
      const size_t width = c.dy ? 2 * kC : kC;
      for (double* p : {together.get(), alone.get()})
        DDP_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(double) * 2 * kC * kShards, ctx().compute()));
      bn.launch_sums(kImages, kShards, x.get(), c.mean, c.dy, together.get(), c.relu_y);
      for (int k = 0; k < kShards; ++k) {
        const size_t at = size_t(k) * kImages * image;
        bn.launch_sums(kImages, 1, x.get() + at, c.mean, c.dy ? c.dy + at : nullptr, alone.get() + k * width,
                       c.relu_y ? c.relu_y + at : nullptr);
      }
      const std::vector<double> t = together.download(), a = alone.download();
      EXPECT_EQ(std::memcmp(t.data(), a.data(), sizeof(double) * width * kShards), 0);
      for (size_t i = 0; i < width * kShards; ++i) ASSERT_NE(a[i], 0.0) << "sum " << i << " was not written";
    }
  }
}

// Note [shard gradients together]: every micro-shard's weight and bias
// gradients from its sums in one launch, each the float the plain backward
// adds into zeroed gradients: float(sum(dy (x - mean)) * invstd) and
// float(sum(dy)).
TEST_F(CudaShardSums, EveryMicroShardsWeightAndBiasGradientsAtOnce) {
  constexpr int kC = 40, kShards = 4, kImages = 6;
  const nn::Shape in{kC, 33, 31};  // several runs a channel in a micro-shard
  const size_t image = size_t(in.numel()), n = size_t(kShards) * kImages * image;
  const nn::Graph g = bn_graph(in);
  ctx().set_next_kernels(true);
  SumProbe bn(g.ops[0], ctx(), nullptr, Layout::NCHW);
  DeviceArray<float> x(ctx(), normal(n, 11)), y(ctx(), n), dy(ctx(), normal(n, 12)),
      w(ctx(), normal(kC, 13)), bias(ctx(), normal(kC, 14)), rm(ctx(), kC), rv(ctx(), std::vector<float>(kC, 1.0f));
  nn::OpArgs a;
  a.batch = kShards * kImages;
  a.x = {x.get()};
  a.y = y.get();
  a.p = {w.get(), bias.get()};
  a.buf = {rm.get(), rv.get()};
  bn.forward(a);  // the constants backward's gradients use
  DeviceArray<double> sums(ctx(), 2 * kC * kShards);
  bn.launch_sums(kImages, kShards, x.get(), bn.chan(), dy.get(), sums.get());
  DeviceArray<float> out(ctx(), 2 * kC * kShards);
  bn.param_grads_of_shards(kShards, sums.get(), out.get());
  const std::vector<double> s = sums.download();
  const std::vector<float> chan = DeviceArray<float>::to_host(ctx(), bn.chan(), 2 * kC), got = out.download();
  for (int k = 0; k < kShards; ++k)
    for (int ch = 0; ch < kC; ++ch) {
      const size_t at = size_t(k) * 2 * kC;
      EXPECT_EQ(bits({got[at + ch]}), bits({0.0f + float(s[at + kC + ch] * double(chan[kC + ch]))})) << k << ", " << ch;
      EXPECT_EQ(bits({got[at + kC + ch]}), bits({0.0f + float(s[at + ch])})) << k << ", " << ch;
    }
}

// A convolution's bias gradients of several parts of a batch in one pass
// (CudaConv::bias_grads_of_parts, Note [shard gradients together]): each
// part's the bits its own backward adds, in both layouts, fp32 and TF32.
TEST_F(CudaShardSums, ConvolutionBiasGradientsOfSeveralPartsAtOnce) {
  constexpr int kParts = 4, kImages = 5, kOut = 24;
  const nn::Shape in{6, 32, 32};  // several runs a channel in a part (NCHW: 5 x 1024 values)
  nn::GraphBuilder b("conv", in, /*pytorch_init=*/true);
  const nn::Graph g = b.finish(b.conv("conv", b.input(), kOut, 3, 1, 1));
  const nn::Op& op = g.ops[0];
  const size_t x_img = size_t(in.numel()), y_img = size_t(op.out.numel()), nw = size_t(kOut) * 6 * 9;
  DeviceArray<float> x(ctx(), normal(x_img * kParts * kImages, 21)), dy(ctx(), normal(y_img * kParts * kImages, 22)),
      w(ctx(), normal(nw, 23)), dw(ctx(), nw);
  ctx().set_next_kernels(true);
  for (const Layout layout : {Layout::NCHW, Layout::NHWC})
    for (const nn::Precision p : {nn::Precision::F32, nn::Precision::TF32}) {
      SCOPED_TRACE(std::string(layout == Layout::NHWC ? "NHWC, " : "NCHW, ") + nn::to_string(p));
      nn::CudaConv conv(op, ctx(), layout);
      conv.set_precision(p);
      const size_t stride = kOut + 7;  // the slots of a span, as the executor's
      DeviceArray<float> together(ctx(), std::vector<float>(stride * kParts, 0.0f)),
          alone(ctx(), std::vector<float>(stride * kParts, 0.0f));
      ASSERT_TRUE(conv.bias_grads_of_parts(kImages, kParts, dy.get(), together.get(), stride));
      for (int k = 0; k < kParts; ++k) {
        nn::OpArgs a;
        a.batch = kImages;
        a.x = {x.get() + size_t(k) * kImages * x_img};
        a.p = {w.get(), nullptr};
        a.dp = {dw.get(), alone.get() + size_t(k) * stride};
        conv.backward(a, dy.get() + size_t(k) * kImages * y_img, {nullptr});
      }
      EXPECT_EQ(bits(together.download()), bits(alone.download()));
    }
  nn::CudaConv half(op, ctx(), Layout::NCHW);
  half.set_precision(nn::Precision::BF16);
  EXPECT_FALSE(half.bias_grads_of_parts(kImages, kParts, dy.get(), dw.get(), kOut)) << "16 bits: not summed so";
}

}  // namespace
}  // namespace ddp::nn_cuda_test
