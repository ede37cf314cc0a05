// check_resumable (Note [resume position]): a checkpoint whose position this
// run cannot stand at, or that lacks what the model needs, is refused naming
// the file, before the trainer counts on from its values.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/core/error.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/train/resume.hpp"

namespace ddp::train {
namespace {

constexpr int64_t kSteps = 18;  // steps per epoch of the run resuming
constexpr int kBatch = 64;

class Resumable : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = nn::make_model("mlp", {1, 28, 28}, 10);
    ckpt_ = {};
    // After step 5 of epoch 2 (0-based epoch 1): global step 18 + 5.
    ckpt_.state.epoch = 1;
    ckpt_.state.step_in_epoch = 5;
    ckpt_.state.global_step = kSteps + 5;
    ckpt_.state.samples_consumed = (kSteps + 5) * kBatch;
    ckpt_.state.world_size = 4;
    ckpt_.state.epoch_samples = 5 * kBatch;
    ckpt_.state.epoch_correct = 100;
    for (const auto& p : model_->param_info())
      ckpt_.file.tensors.push_back({p.name, p.shape, std::vector<float>(p.numel, 0.5f)});
  }
  std::string error() {
    try {
      check_resumable("c.safetensors", ckpt_, *model_, kSteps, kBatch);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  void expect_error(const std::string& part) {
    const std::string msg = error();
    EXPECT_EQ(msg.rfind("c.safetensors: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(part), std::string::npos) << "message lacks '" << part << "': " << msg;
  }
  std::unique_ptr<nn::Model> model_;
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
    check_resumable("c.safetensors", ckpt_, *model_, int64_t(1) << 20, 1 << 20);
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
  expect_error("' has the wrong shape for model mlp");
  // Momentum for the first parameter promises it for every one.
  SetUp();
  const auto& first = model_->param_info().front();
  ckpt_.file.tensors.push_back({"optimizer.momentum_buffer." + first.name, first.shape,
                                std::vector<float>(first.numel, 0.f)});
  expect_error("checkpoint has no tensor 'optimizer.momentum_buffer.");
}

}  // namespace
}  // namespace ddp::train
