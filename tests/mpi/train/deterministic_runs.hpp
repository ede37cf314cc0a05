// What the --deterministic replica tests share on every device
// (deterministic_test.cpp on the CPU, mpi/cuda/deterministic_cuda_test.cpp on
// GPUs): two small nets, every rank's contiguous part of a global batch, and
// a few steps of a replica made by a given backend, at this world size and on
// rank 0 alone, which must end with the same bits.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"  // GraphBuilder
#include "ddp/nn/model.hpp"  // init_state
#include "ddp/train/optim_config.hpp"
#include "ddp/train/replica.hpp"
#include "../test_world.hpp"
#include "make_backend.hpp"  // MakeBackend

namespace ddp::train::test {

// Micro-shards of 2. At world 4 rank 1's part starts 6 samples in, so its
// shards' d(logits) (3 classes) sit 72 bytes before where one rank alone
// has them, an offset not a multiple of 16: a library that picks its
// kernel by pointer alignment (cuBLAS, cuDNN) gets other pointers here than
// there, and the sums must still be the same.
constexpr int kBatch = 24, kShards = 12;
constexpr int kChannels = 2, kSide = 6, kClasses = 3;

// conv -> BatchNorm -> relu -> pool -> fc: enough to have running statistics.
inline nn::Graph small_bn_net() {
  nn::GraphBuilder b("small-bn", {kChannels, kSide, kSide}, /*pytorch_init=*/true);
  int x = b.relu("relu", b.batch_norm("bn", b.conv("conv", b.input(), 4, 3, 1, 1)));
  return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", x)), kClasses));
}

// LeNet's fused conv -> relu -> pool (its relu mask kept per image between
// forward and backward) -> fc.
inline nn::Graph small_lenet() {
  nn::GraphBuilder b("small-lenet", {kChannels, kSide, kSide}, /*pytorch_init=*/true);
  const int x = b.conv_relu_pool("c1", b.input(), 4, 3);
  return b.finish(b.linear("fc", b.flatten("flat", x), kClasses));
}

// This rank's contiguous part of step `step`'s global batch.
inline data::Batch my_part(int rank, int world, int step = 0) {
  const int per = kBatch / world;
  data::Batch b;
  b.size = per;
  for (int i = rank * per; i < (rank + 1) * per; ++i) {
    Rng rng(21 + uint64_t(step), uint64_t(i));
    for (int j = 0; j < kChannels * kSide * kSide; ++j) b.x.push_back(float(rng.normal()));
    b.y.push_back(int32_t((i + step) % kClasses));
  }
  return b;
}

inline Config deterministic_config() {
  Config cfg;
  cfg.batch_size = kBatch;
  cfg.deterministic_shards = kShards;
  cfg.sync_bn = true;
  cfg.momentum = 0.9;
  return cfg;
}

// Floats as their bits: equal means bitwise equal (0.0 and -0.0 differ).
inline std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// `steps` steps at lr 0.1 from `start`, each on this rank's part of its
// global batch; the state after them. With redone, the steps that had to be
// computed again (deterministic/exact_sum.hpp) go there.
inline TrainState run_steps(const World& w, const nn::Graph& g, const TrainState& start, int steps,
                            const MakeBackend& make, int64_t* redone = nullptr) {
  const Config cfg = deterministic_config();
  Replica replica(cfg, optimizer_options(cfg), make(w, cfg), g);
  replica.push(start);
  for (int s = 0; s < steps; ++s)
    EXPECT_TRUE(replica.train_step(my_part(w.rank, w.size, s), 0.1).grads_finite) << "step " << s;
  TrainState after;
  replica.pull(after);
  if (redone) *redone = int64_t(replica.take_sums().redone_steps);
  return after;
}

// Note [fixed-point gradients] (deterministic/exact_sum.hpp): three steps of g at
// world w and on rank 0 alone (a world of one over MPI_COMM_SELF, taking
// every micro-shard) end with the same parameters, buffers and exponents,
// and every rank of w with rank 0's.
inline void expect_world_matches_one_rank(const World& w, const nn::Graph& g, const MakeBackend& make) {
  TrainState start;
  start.model = nn::init_state(g, 4);
  const TrainState all = run_steps(w, g, start, 3, make);
  EXPECT_NE(all.model.params, start.model.params) << "the steps should move the parameters";
  const size_t n = all.model.params.size();
  std::vector<float> every(n * size_t(w.size));
  MPI_Allgather(all.model.params.data(), int(n), MPI_FLOAT, every.data(), int(n), MPI_FLOAT, w.comm);
  for (int r = 1; r < w.size; ++r)
    EXPECT_TRUE(std::equal(every.begin() + long(r * n), every.begin() + long((r + 1) * n), every.begin()))
        << "rank " << r << " differs from rank 0";
  if (w.rank != 0) return;
  World alone = w;
  alone.comm = MPI_COMM_SELF;
  alone.rank = 0;
  alone.size = 1;
  alone.local_rank = 0;
  alone.local_size = 1;
  const TrainState one = run_steps(alone, g, start, 3, make);
  EXPECT_EQ(bits(one.model.params), bits(all.model.params)) << "world " << w.size << " and one rank alone differ";
  EXPECT_EQ(bits(one.model.buffers), bits(all.model.buffers));
  EXPECT_EQ(one.grad_exponents, all.grad_exponents);
}

}  // namespace ddp::train::test
