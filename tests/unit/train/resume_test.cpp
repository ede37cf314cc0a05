// check_resumable (Note [resume position]): a checkpoint whose position this
// run cannot stand at, or that lacks what the model needs, is refused naming
// the file, before the trainer counts on from its values.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/core/error.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/train/resume.hpp"

namespace ddp::train {
namespace {

constexpr int64_t kSteps = 18;  // steps per epoch of the run resuming
constexpr int kBatch = 64;

class Resumable : public ::testing::Test {
 protected:
  void SetUp() override {
    graph_ = nn::model_graph("mlp", {1, 28, 28}, 10);
    ckpt_ = {};
    // After step 5 of epoch 2 (0-based epoch 1): global step 18 + 5.
    ckpt_.state.epoch = 1;
    ckpt_.state.step_in_epoch = 5;
    ckpt_.state.global_step = kSteps + 5;
    ckpt_.state.samples_consumed = (kSteps + 5) * kBatch;
    ckpt_.state.world_size = 4;
    ckpt_.state.epoch_samples = 5 * kBatch;
    ckpt_.state.epoch_correct = 100;
    for (const auto& p : graph_.params) add_tensor(p.name, p.shape, p.numel);
  }
  std::string error(const optim::Options& opt = {}) {
    try {
      check_resumable("c.safetensors", ckpt_, graph_, kSteps, kBatch, opt);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  void expect_error(const std::string& part, const optim::Options& opt = {}) {
    const std::string msg = error(opt);
    EXPECT_EQ(msg.rfind("c.safetensors: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << "message lacks '" << part << "': " << msg;
  }
  void add_tensor(const std::string& name, std::vector<int64_t> shape, size_t numel) {
    checkpoint::Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.data.assign(numel, 0.5f);
    ckpt_.file.tensors.push_back(std::move(t));
  }
  nn::Graph graph_;
  checkpoint::Checkpoint ckpt_;
};

TEST_F(Resumable, AConsistentCheckpointPasses) { EXPECT_EQ(error(), ""); }

TEST_F(Resumable, StepBeyondTheEpoch) {
  ckpt_.state.step_in_epoch = kSteps;
  expect_error("checkpoint is at step 18 of an epoch that has only 18 steps here");
}

TEST_F(Resumable, GlobalStepThatDoesNotFollowFromEpochAndStep) {
  ckpt_.state.global_step += 1;
  expect_error("global step 24 is not epoch 1 x 18 steps + step 5");
}

// Values as large as the decoder lets through (2^50) would overflow
// epoch * steps * batch: refused by checked arithmetic, with no overflow.
TEST_F(Resumable, PositionsThatWouldOverflow) {
  ckpt_.state.epoch = int64_t(1) << 50;
  ckpt_.state.global_step = int64_t(1) << 50;
  try {
    check_resumable("c.safetensors", ckpt_, graph_, int64_t(1) << 20, 1 << 20);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not epoch 1125899906842624 x 1048576 steps"), std::string::npos)
        << e.what();
  }
}

TEST_F(Resumable, SamplesThatDoNotFollowFromTheStep) {
  ckpt_.state.samples_consumed -= kBatch;
  expect_error("counts 1408 samples consumed, not global step 23 x global batch 64");
}

TEST_F(Resumable, WorldSizeThatCannotHaveSplitTheBatch) {
  ckpt_.state.world_size = 3;
  expect_error("written by 3 ranks, which do not divide the global batch 64");
}

TEST_F(Resumable, EpochSumsBeyondTheEpochDone) {
  ckpt_.state.epoch_samples = 6 * kBatch;
  expect_error("exceed the 320 samples of the epoch done");
  ckpt_.state.epoch_samples = 5 * kBatch;
  ckpt_.state.epoch_correct = 5 * kBatch + 1;
  expect_error("exceed the 320 samples");
}

TEST_F(Resumable, MissingOrMisshapenTensors) {
  ckpt_.file.tensors.pop_back();
  expect_error("checkpoint has no tensor '");
  SetUp();
  ckpt_.file.tensors[0].shape = {1};
  expect_error("' has the wrong shape or type for model mlp");
  // Momentum for the first parameter promises it for every one.
  SetUp();
  optim::Options momentum;
  momentum.momentum = 0.9;
  const auto& first = graph_.params.front();
  add_tensor("optimizer.momentum_buffer." + first.name, first.shape, first.numel);
  expect_error("checkpoint has no tensor 'optimizer.momentum_buffer.", momentum);
}

TEST_F(Resumable, OptimizerStateMustMatchItsStepCount) {
  optim::Options adamw;
  adamw.kind = optim::Kind::AdamW;
  checkpoint::Tensor step;
  step.name = "optimizer.step";
  step.dtype = checkpoint::Dtype::I64;
  step.ints = {3};
  ckpt_.file.tensors.push_back(step);
  // Stepped, so AdamW's moments must be there for every parameter.
  expect_error("checkpoint has no tensor 'optimizer.exp_avg.", adamw);
  for (const char* name : {"exp_avg", "exp_avg_sq"})
    for (const auto& p : graph_.params) add_tensor(std::string("optimizer.") + name + "." + p.name, p.shape, p.numel);
  EXPECT_EQ(error(adamw), "");
  for (auto& t : ckpt_.file.tensors)
    if (t.name == "optimizer.step") t.ints = {-1};
  expect_error("optimizer step -1 is negative", adamw);
}

// A model with BatchNorm needs its buffers (F32) and counters (I64 scalars)
// back, not just its parameters.
TEST(ResumableBuffers, BatchNormStateIsRequired) {
  const nn::Graph g = nn::model_graph("resnet18", {1, 28, 28}, 10);
  checkpoint::Checkpoint c;
  c.state.world_size = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, size_t n, bool ints) {
    checkpoint::Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    if (ints) {
      t.dtype = checkpoint::Dtype::I64;
      t.ints.assign(n, 3);
    } else {
      t.data.assign(n, 0.5f);
    }
    c.file.tensors.push_back(std::move(t));
  };
  for (const auto& p : g.params) add(p.name, p.shape, p.numel, false);
  for (const auto& b : g.buffers) add(b.name, b.shape, b.numel, false);
  auto error = [&] {
    try {
      check_resumable("r.safetensors", c, g, 10, 32);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error().find("checkpoint has no tensor '1.num_batches_tracked'"), std::string::npos) << error();
  for (size_t i = 0; i < g.counters.size(); ++i) add(g.counters[i], {}, 1, /*ints=*/i != 0);
  EXPECT_NE(error().find("tensor '1.num_batches_tracked' has the wrong shape or type"), std::string::npos) << error();
  c.file.tensors.erase(c.file.tensors.begin() + long(g.params.size() + g.buffers.size()));
  add(g.counters[0], {}, 1, /*ints=*/true);
  EXPECT_EQ(error(), "");
  TrainState s;
  restore(c, g, {}, s);
  EXPECT_EQ(s.model.counters, std::vector<int64_t>(g.counters.size(), 3));
  EXPECT_EQ(s.model.buffers.size(), g.num_buffers);
  EXPECT_TRUE(s.optimizer.buffers.empty());
}

}  // namespace
}  // namespace ddp::train
