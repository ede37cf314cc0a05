// What --deterministic asks of a replica's backend beyond train::Backend
// (replica.hpp): its step is replica_exact.cpp's. A backend that takes part
// in the mode implements this too; the replica refuses the mode on one that
// does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ddp/deterministic/exact_sum.hpp"  // ExactGradientSum

namespace ddp::train {

class ExactBackend {
 public:
  virtual ~ExactBackend() = default;
  // From now on the backend's device() is the one whose kernels take part
  // in the mode (deterministic/devices.hpp): called before anything uses
  // device().
  virtual void use_shard_device() = 0;
  // The fixed-point sum, its integers in this device's memory.
  virtual std::unique_ptr<ExactGradientSum> make_exact_sum(std::vector<size_t> param_numels, int shards) = 0;
  // From now on each batch's loss sum is rounded to a multiple of 2^-20
  // before it is added (fixed_point::round_loss_sum), so that sums of them
  // are exact in double and the same in any order.
  virtual void set_exact_loss() = 0;
  // Every micro-shard of `shard` samples of the batch, in one call, as
  // Backend::loss gives each alone (its loss sum, rounded as set_exact_loss
  // asks, and its d(loss)/d(logits) over grad_batch samples), where the
  // device can: its losses then stay on the device (true). False: the
  // replica calls Backend::loss a micro-shard at a time.
  virtual bool shard_losses(const float* logits, const int32_t* labels, int batch, int shard, int classes,
                            float* dlogits, int grad_batch) {
    (void)logits, (void)labels, (void)batch, (void)shard, (void)classes, (void)dlogits, (void)grad_batch;
    return false;
  }
};

}  // namespace ddp::train
