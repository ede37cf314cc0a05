// --deterministic --gpu-kernels next on the GPU (Note [checked runs] in
// deterministic/checked_runs.hpp): a batch's micro-shards in one checked call
// per op are each micro-shard's bits as a call of its own gives them, which
// is what makes a step the same at every world size. The host side of the
// check is tests/unit/deterministic/checked_runs_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../nn/model_util.hpp"  // random_batch
#include "ddp/deterministic/devices.hpp"
#include "ddp/deterministic/sharded_model.hpp"
#include "ddp/nn/model.hpp"  // softmax_cross_entropy, init_state
#include "nn_cuda_test_util.hpp"

namespace ddp::nn_cuda_test {
namespace {

using deterministic::ShardedModel;
using nn::Mode;

// A micro-shard of 4: every value's slice of it starts on 16 bytes (5
// logits of 4 samples are 80), as cuBLAS and cuDNN may choose kernels by
// alignment.
constexpr int kBatch = 16, kShard = 4, kClasses = 5, kPixels = 8 * 8;

// Convolutions, ReLU, a residual add, the global pool, flatten and fc on one
// input channel (so that --channels-last can take it): every checkable op
// kind ResNet-18 has, without BatchNorm (whose statistics are the batch's).
nn::Graph residual_net() {
  nn::GraphBuilder b("residual", {1, 8, 8}, /*pytorch_init=*/true);
  const int a = b.relu("relu", b.conv("conv1", b.input(), 8, 3, 1, 1));
  const int c = b.add("add", b.conv("conv2", a, 8, 3, 1, 1), a, /*relu=*/true);
  return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", c)), kClasses));
}

// Each param's gradients as handed over, one micro-shard at a time (from
// the device).
struct Grads final : deterministic::ShardGradients {
  Grads(cuda::Context& ctx, const nn::Graph& g) : ctx(ctx), g(g), shards(g.params.size()) {}
  void take(int, const float* p, size_t first, size_t count) override {
    const size_t base = g.params[first].offset;
    for (size_t q = first; q < first + count; ++q)
      shards[q].push_back(DeviceArray<float>::to_host(ctx, p + (g.params[q].offset - base), g.params[q].numel));
  }
  void taken(size_t, size_t) override {}
  cuda::Context& ctx;
  const nn::Graph& g;
  std::vector<std::vector<std::vector<float>>> shards;
};

// One training forward and backward of `batch` samples from `first` on:
// the logits and each micro-shard's gradients.
struct Step {
  std::vector<float> logits;
  std::vector<std::vector<std::vector<float>>> grads;
};

Step step(cuda::Context& ctx, ShardedModel& model, const nn::test::Batch& b, int first, int batch) {
  DeviceArray<float> x(ctx, std::vector<float>(b.x.begin() + first * kPixels, b.x.begin() + (first + batch) * kPixels));
  model.zero_grads();
  Step s;
  s.logits = DeviceArray<float>::to_host(ctx, model.forward_shards(x.get(), batch, Mode::Train, kShard),
                                         size_t(batch) * kClasses);
  std::vector<float> d(s.logits.size());
  // d(loss)/d(logits) of the whole batch's mean, as the trainer takes it
  // (grad_batch: the global batch), so a micro-shard alone has the
  // gradients it has within the batch.
  nn::softmax_cross_entropy(s.logits.data(), b.y.data() + first, batch, kClasses, d.data(), kBatch);
  DeviceArray<float> dd(ctx, d);
  Grads g(ctx, model.graph());
  model.backward_shards(dd.get(), batch, g);
  s.grads = g.shards;
  return s;
}

class CudaCheckedRuns : public GpuTest {};

// The batch of 4 micro-shards in one model, twice (the first step checks
// each op's one call, the second takes it, and spreads the convolutions'
// weight-gradient calls over the side streams: Note [shard streams]),
// against each micro-shard alone in a model of its own (a world of 4
// ranks): logits and gradients the same bits, in both layouts.
TEST_F(CudaCheckedRuns, OneCallOverTheMicroShardsIsEachMicroShardsOwnBits) {
  const nn::test::Batch b = nn::test::random_batch(kBatch, 41, kPixels, kClasses);
  for (const bool nhwc : {false, true}) {
    SCOPED_TRACE(nhwc ? "channels last" : "NCHW");
    ctx().set_deterministic(true);
    ctx().set_next_kernels(true);
    ctx().set_channels_last(nhwc);
    const std::unique_ptr<nn::Device> dev = deterministic::make_cuda_device(ctx());
    ShardedModel whole(residual_net(), *dev), alone(residual_net(), *dev);
    whole.set_state(nn::init_state(whole.graph(), 3));
    alone.set_state(nn::init_state(alone.graph(), 3));
    for (int repeat = 0; repeat < 2; ++repeat) {
      SCOPED_TRACE("step " + std::to_string(repeat));
      const int64_t spread = ctx().side_calls();
      const Step all = step(ctx(), whole, b, 0, kBatch);
      // Note [shard streams]: from the second step on, both convolutions'
      // 4 micro-shards' weight gradients on side streams.
      EXPECT_EQ(ctx().side_calls() - spread, repeat == 0 ? 0 : 2 * kBatch / kShard);
      for (int s = 0; s < kBatch / kShard; ++s) {
        const Step one = step(ctx(), alone, b, s * kShard, kShard);
        const auto at = all.logits.begin() + s * kShard * kClasses;
        EXPECT_EQ(bits(one.logits), bits(std::vector<float>(at, at + kShard * kClasses))) << "micro-shard " << s;
        for (size_t q = 0; q < one.grads.size(); ++q) {
          ASSERT_EQ(one.grads[q].size(), 1u);
          ASSERT_EQ(all.grads[q].size(), size_t(kBatch / kShard));
          EXPECT_EQ(bits(one.grads[q][0]), bits(all.grads[q][size_t(s)]))
              << whole.graph().params[q].name << ", micro-shard " << s;
        }
      }
    }
  }
}

class CudaSideStreams : public GpuTest {};

// Note [side streams]: each call is issued on a side stream of its own
// (round robin over kSideStreams), with cuDNN's and cuBLAS's handles and a
// workspace of that stream's; each sees what the compute stream held before,
// and the compute stream sees every call after; a call that throws leaves
// the compute stream in place.
TEST_F(CudaSideStreams, CallsRunOnTheirOwnStreamsBetweenWhatCameBeforeAndAfter) {
  constexpr int kCalls = 2 * cuda::Context::kSideStreams + 1;
  constexpr size_t kWords = 1 << 20;
  const cudaStream_t compute = ctx().compute();
  const void* compute_workspace = ctx().workspace(256);
  DeviceArray<float> from(ctx(), normal(kWords, 5)), to(ctx(), size_t(kCalls) * kWords);
  // What the compute stream issues last before the calls: they must see it.
  const std::vector<float> want = normal(kWords, 6);
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(from.get(), want.data(), kWords * sizeof(float), cudaMemcpyHostToDevice, compute));
  std::vector<cudaStream_t> streams;
  std::vector<const void*> workspaces;
  const int64_t before = ctx().side_calls();
  ctx().on_side_streams(kCalls, [&](int64_t i) {
    streams.push_back(ctx().compute());
    workspaces.push_back(ctx().workspace(256));
    cudaStream_t handle_stream = nullptr;
    DDP_CUDNN_CHECK(cudnnGetStream(ctx().dnn(), &handle_stream));
    EXPECT_EQ(handle_stream, ctx().compute()) << "call " << i;
    DDP_CUDA_CHECK(cudaMemcpyAsync(to.get() + size_t(i) * kWords, from.get(), kWords * sizeof(float),
                                   cudaMemcpyDeviceToDevice, ctx().compute()));
  });
  EXPECT_EQ(ctx().compute(), compute);
  EXPECT_EQ(ctx().side_calls() - before, kCalls);
  ASSERT_EQ(streams.size(), size_t(kCalls));
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_NE(streams[size_t(i)], compute) << "call " << i;
    EXPECT_NE(workspaces[size_t(i)], compute_workspace) << "call " << i;
    const int k = i % cuda::Context::kSideStreams;
    EXPECT_EQ(streams[size_t(i)], streams[size_t(k)]) << "call " << i;
    EXPECT_EQ(workspaces[size_t(i)], workspaces[size_t(k)]) << "call " << i;
    if (i > 0 && i < cuda::Context::kSideStreams) {
      EXPECT_NE(streams[size_t(i)], streams[0]) << "call " << i;
    }
  }
  // Read on the compute stream: every call's copy is there.
  const std::vector<float> all = to.download();
  for (int i = 0; i < kCalls; ++i)
    EXPECT_EQ(bits(std::vector<float>(all.begin() + i * kWords, all.begin() + (i + 1) * kWords)), bits(want))
        << "call " << i;
  EXPECT_THROW(ctx().on_side_streams(3,
                                     [&](int64_t i) {
                                       if (i == 1) throw std::runtime_error("call 1 failed");
                                     }),
               std::runtime_error);
  EXPECT_EQ(ctx().compute(), compute);
  cudaStream_t handle_stream = nullptr;
  DDP_CUDNN_CHECK(cudnnGetStream(ctx().dnn(), &handle_stream));
  EXPECT_EQ(handle_stream, compute);
}

}  // namespace
}  // namespace ddp::nn_cuda_test
