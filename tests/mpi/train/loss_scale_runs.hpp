// --precision fp16's loss scaler on the replica's step (optim/grad_scaler.hpp),
// for any device's backend: a scale that overflows fp16 skips the step on
// every rank alike, leaving the parameters and the optimizer as they were,
// and halves the scale until the steps fit; then they move the parameters,
// the same bits on every rank. loss_scale_test.cpp runs it on CPU ranks,
// mpi/cuda/precision_cuda_test.cpp on GPU ranks (Note [half kernels]).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"  // model_graph
#include "ddp/nn/model.hpp"  // init_state
#include "ddp/train/optim_config.hpp"
#include "ddp/train/replica.hpp"
#include "../test_world.hpp"
#include "make_backend.hpp"  // MakeBackend

namespace ddp::train::test {

constexpr int kLossScalePerRank = 8;

inline data::Batch loss_scale_batch(int rank, int step) {
  data::Batch b;
  b.size = kLossScalePerRank;
  Rng rng(13 + uint64_t(step), uint64_t(rank));
  b.x.resize(size_t(kLossScalePerRank) * 28 * 28);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < kLossScalePerRank; ++i) b.y.push_back(int32_t(rng.below(10)));
  return b;
}

// Every rank's copy of v, each checked against rank 0's.
inline void expect_same_on_every_rank(const World& w, const std::vector<float>& v, const char* what) {
  std::vector<float> all(v.size() * size_t(w.size));
  MPI_Allgather(v.data(), int(v.size()), MPI_FLOAT, all.data(), int(v.size()), MPI_FLOAT, w.comm);
  for (int r = 1; r < w.size; ++r)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(all[size_t(r) * v.size() + i], all[i]) << what << ": rank " << r << " differs at " << i;
}

// The tests' fp16 configuration: kLossScalePerRank samples a rank, the
// scale starting at init_scale.
inline Config fp16_config(const World& w, double init_scale) {
  Config cfg;
  cfg.batch_size = kLossScalePerRank * w.size;
  cfg.precision = "fp16";
  cfg.init_scale = init_scale;
  return cfg;
}

// make may put the loss scale's decisions on the device (Note [loss scale on
// the device]): each step's outcome is then what the step or settle() after
// it reports.
inline void expect_overflow_skipped_and_halved(const World& w, const MakeBackend& make) {
  Config cfg = fp16_config(w, 0x1p40);  // d(loss) * 2^40 is far past fp16's 65504
  cfg.growth_interval = 1000;
  cfg.momentum = 0.9;
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  TrainState start;
  start.model = nn::init_state(g, 5);
  Replica replica(cfg, optimizer_options(cfg), make(w, cfg), g);
  replica.push(start);
  float scale = 0x1p40f;
  int step = 0, skipped = 0;
  for (;; ++step) {
    ASSERT_LT(step, 60) << "the scale never came down to one that fits";
    StepHealth h = replica.train_step(loss_scale_batch(w.rank, step), 0.05);
    if (const StepHealth late = replica.settle(); late.skipped) h = late;
    std::vector<float> flags = {h.skipped ? 1.0f : 0.0f, replica.scaler()->scale()};
    expect_same_on_every_rank(w, flags, "skipped, and the scale after");
    if (!h.skipped) break;
    ++skipped;
    scale /= 2;
    EXPECT_FALSE(h.grads_finite);
    EXPECT_EQ(replica.scaler()->scale(), scale) << "step " << step;
    EXPECT_EQ(replica.optimizer().steps(), 0) << "a skipped step is no optimizer step";
    TrainState now;
    replica.pull(now);
    ASSERT_EQ(now.model.params, start.model.params) << "skipped step " << step << " moved the parameters";
  }
  EXPECT_GE(skipped, 10) << "2^40 should overflow for many halvings";
  EXPECT_EQ(replica.scaler()->scale(), scale) << "a good step keeps the scale";
  EXPECT_EQ(replica.scaler()->growth_tracker(), 1);
  EXPECT_EQ(replica.optimizer().steps(), 1);
  TrainState after;
  replica.pull(after);
  EXPECT_NE(after.model.params, start.model.params) << "the first good step should move the parameters";
  expect_same_on_every_rank(w, after.model.params, "parameters after the first good step");
  EXPECT_EQ(after.loss_scale, scale);
  EXPECT_EQ(after.scaler_growth_tracker, 1);
}

}  // namespace ddp::train::test
