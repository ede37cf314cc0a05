// Note [step graphs] (train/step_graphs.hpp), below the replica: ResNet-18's
// training step (forward, loss, backward, AdamW with clipping) captured once
// on the compute stream and replayed gives, step after step, the bits of the
// same steps as issued: the learning rate and bias corrections of each step
// read from the device, BatchNorm's counters moved as the capture moved
// them, deterministic algorithms on both sides. Nothing is allocated or
// freed while capturing (Context::set_capturing would refuse it).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/cuda/device.hpp"   // make_cuda_device, softmax_cross_entropy_cuda
#include "ddp/nn/graph.hpp"         // model_graph
#include "ddp/nn/model.hpp"         // Model, init_state
#include "ddp/optim/kernels.hpp"    // make_cuda_kernels
#include "ddp/optim/optimizer.hpp"  // Optimizer
#include "ddp/runtime/cuda_check.hpp"
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::DeviceArray;
using nn_cuda_test::to_host;

class CudaStepGraphs : public nn_cuda_test::GpuTest {};

struct Rank {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Model> model;
  std::unique_ptr<optim::Kernels> kernels;
  std::unique_ptr<optim::Optimizer> opt;
};

TEST_F(CudaStepGraphs, ACapturedStepReplaysAsTheStepsAsIssued) {
  ctx().set_deterministic(true);
  const Shape input{1, 28, 28};
  const int classes = 10, batch = 16, steps = 6, capture_at = 3;
  optim::Options o;
  o.kind = optim::Kind::AdamW;
  o.weight_decay = 0.01;
  o.max_grad_norm = 1.0;
  Rank ranks[2];
  for (Rank& r : ranks) {
    r.dev = make_cuda_device(ctx());
    r.model = std::make_unique<Model>(model_graph("resnet18", input, classes), *r.dev);
    r.model->set_state(init_state(r.model->graph(), 42));
    r.kernels = optim::make_cuda_kernels(ctx().compute());
    r.opt = std::make_unique<optim::Optimizer>(o, r.model->param_info(), *r.dev, *r.kernels);
  }
  // One batch's memory, refilled each step, as a pinned slot's is.
  const auto [x0, labels0] = nn_cuda_test::step_inputs(0, batch, size_t(input.numel()), classes);
  DeviceArray<float> x(ctx(), x0), dlogits(ctx(), size_t(batch) * classes);
  DeviceArray<int32_t> labels(ctx(), labels0);
  DeviceArray<double> sums(ctx(), std::vector<double>{0.0, 0.0});
  const auto issue = [&](Rank& r, double lr) {
    r.model->zero_grads();
    const float* logits = r.model->forward(x.get(), batch);
    softmax_cross_entropy_cuda(logits, labels.get(), batch, classes, dlogits.get(), sums.get(), ctx().compute());
    r.model->backward(dlogits.get(), batch, [](size_t) {});
    r.opt->step(lr, r.model->params(), r.model->grads());
  };
  const auto refill = [&](int step) {
    const auto [xs, ls] = nn_cuda_test::step_inputs(step, batch, size_t(input.numel()), classes);
    DDP_CUDA_CHECK(cudaMemcpyAsync(x.get(), xs.data(), xs.size() * sizeof(float), cudaMemcpyHostToDevice,
                                   ctx().compute()));
    DDP_CUDA_CHECK(cudaMemcpyAsync(labels.get(), ls.data(), ls.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   ctx().compute()));
    ctx().sync();
  };
  const auto lr = [](int step) { return 1e-3 / double(step + 1); };
  cudaGraphExec_t exec = nullptr;
  std::vector<int64_t> moved;  // the captured step's counters
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    refill(step);
    issue(ranks[0], lr(step));
    Rank& g = ranks[1];
    if (step < capture_at) {
      issue(g, lr(step));
      continue;
    }
    g.opt->stage_scalars(lr(step));
    if (step == capture_at) {
      const std::vector<int64_t> before = g.model->counters();
      const uint64_t generation = ctx().generation();
      DDP_CUDA_CHECK(cudaStreamBeginCapture(ctx().compute(), cudaStreamCaptureModeThreadLocal));
      ctx().set_capturing(true);
      issue(g, lr(step));
      ctx().set_capturing(false);
      cudaGraph_t graph = nullptr;
      DDP_CUDA_CHECK(cudaStreamEndCapture(ctx().compute(), &graph));
      DDP_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
      DDP_CUDA_CHECK(cudaGraphDestroy(graph));
      EXPECT_EQ(ctx().generation(), generation) << "nothing freed or moved while capturing";
      moved = g.model->counters();
      for (size_t i = 0; i < moved.size(); ++i) moved[i] -= before[i];
      DDP_CUDA_CHECK(cudaGraphLaunch(exec, ctx().compute()));
    } else {
      DDP_CUDA_CHECK(cudaGraphLaunch(exec, ctx().compute()));
      g.opt->replayed();
      for (size_t i = 0; i < moved.size(); ++i) g.model->counters()[i] += moved[i];
    }
  }
  ctx().sync();
  DDP_CUDA_CHECK(cudaGraphExecDestroy(exec));
  EXPECT_EQ(ranks[1].opt->steps(), ranks[0].opt->steps());
  ModelState a, b;
  ranks[0].model->get_state(a);
  ranks[1].model->get_state(b);
  EXPECT_EQ(a.params, b.params) << "parameters";
  EXPECT_EQ(a.buffers, b.buffers) << "BatchNorm's running statistics";
  EXPECT_EQ(a.counters, b.counters) << "BatchNorm's counters";
  optim::State sa, sb;
  ranks[0].opt->get_state(sa);
  ranks[1].opt->get_state(sb);
  ASSERT_EQ(sa.buffers.size(), 2u);
  for (size_t k = 0; k < sa.buffers.size(); ++k) EXPECT_EQ(sa.buffers[k].second, sb.buffers[k].second) << k;
}

}  // namespace
}  // namespace ddp::nn
