// What the CPU's and the GPU's BatchNorm for --deterministic share: the
// calls of ShardedBatchKernel over a device's plain BatchNorm, which take the
// micro-shards' sums in its channel_sums while shard_ is set.
#pragma once

#include <functional>
#include <vector>

#include "ddp/core/scoped.hpp"           // Scoped
#include "ddp/deterministic/shards.hpp"  // ShardedBatchKernel

namespace ddp::deterministic {

template <typename BatchNorm>
class ShardedBatch : public BatchNorm, public ShardedBatchKernel {
 public:
  using BatchNorm::BatchNorm;
  void forward_shards(const nn::OpArgs& a, int shard) override {
    Scoped<int> in(shard_, shard);
    this->forward(a);
  }
  void backward_shards(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx, int shard,
                       const std::function<void()>& take, const TakeShards* together) override {
    Scoped<int> in(shard_, shard);
    Scoped<const std::function<void()>*> taking(take_, &take);
    Scoped<const TakeShards*> all(together_, together);
    this->backward(a, dy, dx);
  }

 protected:
  int shard_ = 0;  // the micro-shards of the call running (0: a plain call)
  const std::function<void()>* take_ = nullptr;  // backward_shards': takes a micro-shard's gradients
  const TakeShards* together_ = nullptr;         // backward_shards': takes them all at once, or nullptr
};

}  // namespace ddp::deterministic
