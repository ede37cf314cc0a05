// One Model on the GPU device against one on the CPU device: the same state
// set on both, then two full training steps (forward, loss, backward, SGD with
// momentum and weight decay, so the second step runs the momentum update):
// logits, loss, accuracy, gradients, parameters and buffers agree, and
// on_ready reports the same growing prefixes (Note [flat layout]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"     // ddp::Error
#include "ddp/core/rng.hpp"       // inputs and labels
#include "ddp/nn/cuda_device.hpp"  // make_cuda_device, softmax_cross_entropy_cuda
#include "ddp/nn/graph.hpp"        // model_graph
#include "ddp/nn/model.hpp"        // Model, init_state, softmax_cross_entropy
#include "ddp/optim/kernels.hpp"    // the CPU and GPU optimizer kernels
#include "ddp/optim/optimizer.hpp"  // Optimizer: SGD with momentum on each device
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::agrees_in_scale;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::to_host;

// Note [gradients in their own scale]: agrees() is absolute below 1, and
// from an N(0, 0.01) start LeNet's logits and weight gradients are ~1e-5 down
// to ~1e-8: it would pass them wrong, or zero. So each tensor is also held to
// its own largest value (agrees_in_scale). Loosely for gradients: a relu
// input within float rounding of 0 (rare: an estimated one in a million) may
// pass on one device and not on the other, which moves a few gradient
// entries by up to a few % of their tensor's largest (worst: the MLP's
// fc1.bias, a sum over 64 rows); a wiring error moves them by ~100%.
class CudaModels : public nn_cuda_test::GpuTest {
 protected:
  void two_steps(const std::string& name, int batch);
};

void CudaModels::two_steps(const std::string& name, int batch) {
  SCOPED_TRACE(name + " batch " + std::to_string(batch));
  const Shape input{1, 28, 28};
  const int classes = 10;
  auto cpu_dev = make_cpu_device(2);
  auto gpu_dev = make_cuda_device(ctx());
  Model cpu(model_graph(name, input, classes), *cpu_dev);
  Model gpu(model_graph(name, input, classes), *gpu_dev);
  const ModelState start = init_state(cpu.graph(), 42);
  cpu.set_state(start);
  gpu.set_state(start);
  const size_t n = cpu.num_params(), nb = cpu.graph().num_buffers;
  ModelState round_trip;
  gpu.get_state(round_trip);
  ASSERT_EQ(round_trip.params, start.params);
  ASSERT_EQ(round_trip.buffers, start.buffers);

  optim::Options opt;
  opt.momentum = 0.9;
  opt.weight_decay = 1e-4;
  nn_cuda_test::OptimizerPair sgd(ctx(), opt, cpu, gpu);
  const size_t nx = size_t(batch) * size_t(input.numel()), nl = size_t(batch) * classes;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto [x, labels] = nn_cuda_test::step_inputs(step, batch, size_t(input.numel()), classes);

    cpu.zero_grads();
    const float* logits = cpu.forward(x.data(), batch);
    const std::vector<float> cpu_logits(logits, logits + nl);
    std::vector<float> dlogits(nl);
    const float loss = softmax_cross_entropy(logits, labels.data(), batch, classes, dlogits.data());
    const int64_t correct = count_correct(logits, labels.data(), batch, classes);
    std::vector<size_t> cpu_ready;
    cpu.backward(dlogits.data(), batch, [&](size_t k) { cpu_ready.push_back(k); });
    const std::vector<float> cpu_grads(cpu.grads(), cpu.grads() + n);
    sgd.cpu.step(0.1, cpu.params(), cpu.grads());

    DeviceArray<float> gx(ctx(), x), gdlogits(ctx(), nl);
    DeviceArray<int32_t> glabels(ctx(), labels);
    DeviceArray<double> sums(ctx(), std::vector<double>{0.0, 0.0});
    gpu.zero_grads();
    const float* glogits = gpu.forward(gx.get(), batch);
    softmax_cross_entropy_cuda(glogits, glabels.get(), batch, classes, gdlogits.get(), sums.get(), ctx().compute());
    std::vector<size_t> ready;
    gpu.backward(gdlogits.get(), batch, [&](size_t k) { ready.push_back(k); });
    const std::vector<float> grads = to_host(ctx(), gpu.grads(), n);
    sgd.gpu.step(0.1, gpu.params(), gpu.grads());

    EXPECT_TRUE(agrees(to_host(ctx(), glogits, nl), cpu_logits)) << "logits";
    EXPECT_TRUE(agrees(gdlogits.download(), dlogits)) << "dlogits";
    const std::vector<double> s = sums.download();
    EXPECT_NEAR(s[0] / batch, loss, 1e-4 * std::max(1.0f, std::fabs(loss))) << "loss";
    EXPECT_EQ(s[1], double(correct)) << "correct";
    EXPECT_TRUE(agrees(grads, cpu_grads)) << "grads";
    const std::vector<float> gpu_logits = to_host(ctx(), glogits, nl);
    EXPECT_TRUE(agrees_in_scale(gpu_logits.data(), cpu_logits.data(), nl, 1e-3)) << "logits, in their own scale";
    for (const TensorInfo& p : cpu.param_info())
      EXPECT_TRUE(agrees_in_scale(grads.data() + p.offset, cpu_grads.data() + p.offset, p.numel, 1e-1))
          << p.name << " grad, in its own scale";
    ModelState after;
    gpu.get_state(after);
    EXPECT_TRUE(agrees(after.params, std::vector<float>(cpu.params(), cpu.params() + n))) << "params";
    if (nb) {
      EXPECT_TRUE(agrees(after.buffers, std::vector<float>(cpu.buffers(), cpu.buffers() + nb))) << "buffers";
    }
    EXPECT_EQ(after.counters, cpu.counters());

    EXPECT_EQ(ready, cpu_ready);
    ASSERT_FALSE(ready.empty());
    for (size_t i = 1; i < ready.size(); ++i) EXPECT_LE(ready[i - 1], ready[i]) << "on_ready went back at " << i;
    EXPECT_EQ(ready.back(), n);
  }
  // Evaluation: BatchNorm on the running statistics, on both devices.
  Rng rng(9, 0);
  std::vector<float> x(nx);
  for (float& v : x) v = rng.uniform();
  DeviceArray<float> gx(ctx(), x);
  const float* e = cpu.forward(x.data(), batch, Mode::Eval);
  const std::vector<float> cpu_eval(e, e + nl);
  EXPECT_TRUE(agrees(to_host(ctx(), gpu.forward(gx.get(), batch, Mode::Eval), nl), cpu_eval)) << "eval logits";
}

TEST_F(CudaModels, LenetTwoSgdStepsMatchCpu) { two_steps("lenet", 64); }

TEST_F(CudaModels, MlpTwoSgdStepsMatchCpu) { two_steps("mlp", 64); }

// A batch that is not the first one's (the last, partial batch of an epoch).
TEST_F(CudaModels, LenetOddBatch) { two_steps("lenet", 7); }

// The network the redesign is for: its residual fan-out, BatchNorm in both
// modes, strided and 1x1 convolutions and global pooling, a full step.
TEST_F(CudaModels, Resnet18TwoSgdStepsMatchCpu) { two_steps("resnet18", 16); }

TEST_F(CudaModels, BackwardAtAnotherBatchIsAnError) {
  auto dev = make_cuda_device(ctx());
  Model gpu(model_graph("mlp", {1, 28, 28}, 10), *dev);
  DeviceArray<float> x(ctx(), 8 * 784), dlogits(ctx(), 8 * 10);
  gpu.forward(x.get(), 8);
  EXPECT_THROW(gpu.backward(dlogits.get(), 4), Error);
}

}  // namespace
}  // namespace ddp::nn
