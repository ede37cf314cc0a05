// --clip-grad-norm on the replica's step: the norm is taken after the
// all-reduce, so every rank clips the same averaged gradient by the same
// factor, and the step is torch.nn.utils.clip_grad_norm_ of the average.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "ddp/comm/communicator.hpp"  // make_mpi_communicator
#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"           // model_graph
#include "ddp/nn/model.hpp"           // Model, init_state
#include "ddp/train/optim_config.hpp"
#include "ddp/train/replica.hpp"
#include "../test_world.hpp"

namespace ddp::train {
namespace {

constexpr int kPerRank = 16;

data::Batch batch_of(int rank) {
  data::Batch b;
  b.size = kPerRank;
  Rng rng(11, uint64_t(rank));
  b.x.resize(size_t(kPerRank) * 28 * 28);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < kPerRank; ++i) b.y.push_back(int32_t(rng.below(10)));
  return b;
}

TEST(ClipAfterAllReduce, EveryRankTakesTheSameStepAndItIsPyTorchsClipOfTheAverage) {
  const World w = test::test_world();
  Config cfg;
  cfg.batch_size = kPerRank * w.size;
  cfg.clip_grad_norm = 1e-3;  // far below LeNet's gradient norm: every step clips
  const double lr = 0.1;
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  TrainState start;
  start.model = nn::init_state(g, 5);
  Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w)), g);
  replica.push(start);
  const data::Batch b = batch_of(w.rank);
  ASSERT_TRUE(replica.train_step(b, lr).grads_finite);
  TrainState after;
  replica.pull(after);
  const size_t n = g.num_params;

  // Every rank's parameters, bit for bit.
  std::vector<float> all(n * size_t(w.size));
  MPI_Allgather(after.model.params.data(), int(n), MPI_FLOAT, all.data(), int(n), MPI_FLOAT, w.comm);
  for (int r = 1; r < w.size; ++r)
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(all[size_t(r) * n + i], all[i]) << "rank " << r << " differs from rank 0 at element " << i;

  // The reference: each rank's own gradient, averaged in double, clipped as
  // PyTorch does (max_norm / (norm + 1e-6)), one SGD step.
  auto device = nn::make_cpu_device(1);
  nn::Model m(g, *device);
  m.set_state(start.model);
  m.zero_grads();
  const float* logits = m.forward(b.x.data(), b.size);
  std::vector<float> dlogits(size_t(b.size) * 10);
  nn::softmax_cross_entropy(logits, b.y.data(), b.size, 10, dlogits.data());
  m.backward(dlogits.data(), b.size);
  std::vector<double> avg(m.grads(), m.grads() + n);
  MPI_Allreduce(MPI_IN_PLACE, avg.data(), int(n), MPI_DOUBLE, MPI_SUM, w.comm);
  double sq = 0;
  for (double& v : avg) {
    v /= w.size;
    sq += v * v;
  }
  const double coef = cfg.clip_grad_norm / (std::sqrt(sq) + 1e-6);
  ASSERT_LT(coef, 0.1);  // it clips
  double worst = 0, step_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const double want = lr * coef * avg[i], got = double(start.model.params[i]) - double(after.model.params[i]);
    worst = std::max(worst, std::abs(got - want));
    step_sq += got * got;
  }
  // The step's norm is lr * max_norm, and each element is the reference's
  // to float rounding of the parameters (~1e-9 for values near 0.01).
  EXPECT_NEAR(std::sqrt(step_sq), lr * cfg.clip_grad_norm, 1e-3 * lr * cfg.clip_grad_norm);
  EXPECT_LT(worst, 1e-8) << "largest difference from PyTorch's clip of the averaged gradient";
}

}  // namespace
}  // namespace ddp::train
