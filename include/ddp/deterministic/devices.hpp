// The devices whose kernels take part in --deterministic (Note
// [micro-shards], Note [lanes] in deterministic/shards.hpp): the CPU's, its
// threads its lanes, and the GPU's, one lane (micro-shards one after another
// on its compute stream). Each is the plain device with the kernels that
// need more than a plain call on part of the batch replaced by the mode's.
// A synchronised BatchNorm (stats given to Device::kernel) sums its
// micro-shards over ranks with stats, which must then be a ShardStats too.
#pragma once

#include <memory>
#include <string>

#include "ddp/nn/device.hpp"  // Device
#if DDP_HAVE_CUDA
#include "ddp/runtime/cuda_context.hpp"  // cuda::Context
#endif

namespace ddp::deterministic {

std::unique_ptr<nn::Device> make_cpu_device(int threads);
#if DDP_HAVE_CUDA
std::unique_ptr<nn::Device> make_cuda_device(cuda::Context& ctx);
#endif

// The ShardStats a synchronised BatchNorm of op `op` sums its micro-shards
// with: stats itself, which must be one; nullptr without stats.
class ShardStats;
ShardStats* shard_stats(nn::StatsReducer* stats, const std::string& op);

}  // namespace ddp::deterministic
