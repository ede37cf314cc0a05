// DistributedSampler, permutation, eval_shard: see Note [global step] in
// sampler.hpp for why every rank slices one shared permutation.
#include "ddp/data/sampler.hpp"

#include <numeric>
#include <utility>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"

namespace ddp::data {
namespace {

void check_rank(const char* who, int64_t n, int world_size, int rank) {
  DDP_CHECK(n >= 0, who, ": dataset size ", n, " is negative");
  DDP_CHECK(world_size >= 1, who, ": world size ", world_size, " must be at least 1");
  DDP_CHECK(rank >= 0 && rank < world_size, who, ": rank ", rank, " is outside [0, ", world_size,
            ")");
}

}  // namespace

std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  DDP_CHECK(n >= 0, "permutation: size ", n, " is negative");
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  Rng rng(seed, epoch);
  // Fisher-Yates from the top, as Knuth (Algorithm P) and numpy write it; the
  // order is part of the contract (resume reproduces it), so do not reorder.
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank,
                                       uint64_t seed, bool shuffle, bool drop_last)
    : n_(dataset_size),
      world_(world_size),
      rank_(rank),
      seed_(seed),
      shuffle_(shuffle),
      drop_last_(drop_last) {
  check_rank("DistributedSampler", dataset_size, world_size, rank);
  // PyTorch: with drop_last ceil((N - W) / W) == floor(N / W) (0 when N < W,
  // which the trainer reports as "dataset too small"); without it ceil(N / W),
  // the tail padded from the front of the permutation.
  num_samples_ = drop_last ? n_ / world_ : (n_ + world_ - 1) / world_;
}

void DistributedSampler::set_contiguous(int64_t global_batch) {
  DDP_CHECK(global_batch >= 1 && global_batch % world_ == 0, "DistributedSampler: global batch ", global_batch,
            " does not split over ", world_, " ranks");
  DDP_CHECK(drop_last_, "DistributedSampler: contiguous shards deal whole global batches only (drop_last)");
  contiguous_ = global_batch;
  num_samples_ = n_ / global_batch * (global_batch / world_);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = permutation(n_, seed_, epoch_);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  std::vector<int64_t> mine(static_cast<size_t>(num_samples_));
  if (contiguous_ > 0) {
    const int64_t b = contiguous_ / world_;
    for (int64_t k = 0; k < num_samples_; ++k)
      mine[k] = order[static_cast<size_t>(k / b * contiguous_ + rank_ * b + k % b)];
    return mine;
  }
  for (int64_t k = 0; k < num_samples_; ++k) {
    // Position rank + k*W of the (padded) permutation. PyTorch pads with
    // indices[:pad] repeated as often as needed, i.e. position i holds
    // order[i % N]; with drop_last i < N always.
    mine[k] = order[static_cast<size_t>((rank_ + k * world_) % n_)];
  }
  return mine;
}

std::vector<int64_t> eval_shard(int64_t n, int world_size, int rank) {
  check_rank("eval_shard", n, world_size, rank);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(n / world_size + 1));
  for (int64_t i = rank; i < n; i += world_size) mine.push_back(i);
  return mine;
}

}  // namespace ddp::data
