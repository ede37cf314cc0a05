// ddp::data::DistributedSampler: PyTorch DistributedSampler semantics.
//
// Note [global step]: the permutation of [0, N) depends only on (seed, epoch).
// With drop_last, num_samples = floor(N / W) and rank r takes
// perm[r], perm[r + W], ...; the loader drops a partial last batch. With global
// batch B = W * b, the samples of global step t are perm[t*B, (t+1)*B) whatever
// W is. This makes "np 4 equals np 1" and resume on another world size exact.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::data {

// Permutation of [0, n) by Fisher-Yates over ddp::Rng(seed, epoch).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t epoch);

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int world_size, int rank, uint64_t seed,
                     bool shuffle = true, bool drop_last = true);
  // --deterministic: rank r takes a contiguous run of each global batch of
  // global_batch positions, perm[t*B + r*b, t*B + (r+1)*b) with b = B / W, so
  // that a micro-shard (a contiguous block of the global batch) holds the
  // same samples in the same order at every world size. Only whole global
  // batches are dealt.
  void set_contiguous(int64_t global_batch);
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  int64_t num_samples() const { return num_samples_; }
  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<int64_t> indices() const;

 private:
  int64_t n_;
  int world_, rank_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  uint64_t epoch_ = 0;
  int64_t num_samples_;
  int64_t contiguous_ = 0;  // the global batch of set_contiguous; 0: strided
};

// Evaluation shard: rank r takes r, r + W, r + 2W, ... < n (no padding, no drop),
// so summing correct counts over ranks is exact.
std::vector<int64_t> eval_shard(int64_t n, int world_size, int rank);

}  // namespace ddp::data
