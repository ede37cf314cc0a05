// What replica.cpp and replica_exact.cpp share of Replica's insides.
#pragma once

#include <memory>
#include <string>

#include "ddp/deterministic/exact_sum.hpp"      // ExactGradientSum
#include "ddp/deterministic/sharded_model.hpp"  // ShardedModel
#include "ddp/nn/device.hpp"                    // StatsReducer
#include "ddp/train/exact_backend.hpp"          // ExactBackend
#include "ddp/train/replica.hpp"

namespace ddp::train {

// SyncBatchNorm's sums, over the backend's communicator (host memory,
// blocking, bounded by its timeout).
class Replica::Stats : public nn::StatsReducer {
 public:
  explicit Stats(Backend& backend) : backend_(backend) {}
  void sum(double* data, size_t n, const std::string& what) override {
    backend_.comm().allreduce_doubles(data, n, /*max=*/false, "sync batch norm: " + what);
  }
  void sum_on_device(double* data, size_t n, const std::string& what) override {
    backend_.comm().allreduce_doubles_async(data, n, "sync batch norm: " + what)->wait();
  }
  int ranks() const override { return backend_.comm().size(); }
  void sync_device(const std::string& what) override { backend_.sync("sync batch norm: " + what); }

 protected:
  Backend& backend_;
};

// --deterministic's model (model_, in micro-shards of `shard` samples, the
// global batch being global_batch) and its fixed-point sum.
struct Replica::Exact {
  ExactBackend* backend = nullptr;  // the replica's backend
  deterministic::ShardedModel* model = nullptr;
  std::unique_ptr<ExactGradientSum> sum;
  int shard = 0, global_batch = 0;
};

}  // namespace ddp::train
