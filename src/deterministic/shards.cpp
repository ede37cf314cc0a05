// The helpers of deterministic/shards.hpp.
#include "ddp/deterministic/shards.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"

namespace ddp::deterministic {

void LaneKernel::backward_to_sinks(const nn::OpArgs&, const float*, const std::vector<float*>&, const Lane&, int,
                                   const std::vector<fixed_point::Sink>&) {
  DDP_FAIL("this kernel converts no gradients into fixed-point sums (grads_to_sinks is false)");
}

int shards_of(int batch, int shard, const std::string& op) {
  DDP_CHECK(shard > 0 && batch % shard == 0, "BatchNorm2d ", op, ": a batch of ", batch,
            " does not split into micro-shards of ", shard);
  return batch / shard;
}

void sum_in_shard_order(const double* per_shard, size_t shards, size_t n, double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = 0.0;
  for (size_t k = 0; k < shards; ++k)
    for (size_t i = 0; i < n; ++i) out[i] += per_shard[k * n + i];
}

std::vector<ShardRun> shard_runs_on_lanes(int batch, int shard, int lanes) {
  DDP_CHECK(batch >= 0 && shard > 0 && lanes > 0, "micro-shard runs: batch ", batch, ", shard ", shard, ", lanes ",
            lanes);
  const int64_t whole = batch / shard, runs = std::min<int64_t>(lanes, whole);
  std::vector<ShardRun> out;
  for (int64_t r = 0; r < runs; ++r) out.push_back({r * whole / runs, (r + 1) * whole / runs - r * whole / runs});
  if (batch % shard) out.push_back({whole, 1});
  return out;
}

}  // namespace ddp::deterministic
