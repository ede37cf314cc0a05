// ddp::nn::plan_bn_split: how the GPU's BatchNorm sums a channel (src/nn/cuda/
// batch_norm.cu), as plain host code so the rule is checked on machines
// without a GPU (tests/unit/nn/bn_plan_test.cpp).
//
// Note [batch norm sums]: one block a channel leaves most of a GPU idle on
// the wide layers (64 channels: 64 blocks on 132 SMs) and reads the tensor
// at a fraction of memory speed. So each channel's values (batch x H x W,
// image after image) are cut into `splits` equal runs of `per_split`, one
// block a run, enough blocks to fill every SM several times over; each block
// sums its run in double in a fixed tree, and a second pass adds each
// channel's runs in run order. The cut depends only on the number of values,
// the channels and the GPU's SM count, never on timing: a call's sums repeat
// bit for bit, and a micro-shard's sums (--deterministic) are the same at
// every world size.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ddp::nn {

struct BnSplit {
  int splits = 1;         // runs per channel (blocks per channel)
  int64_t per_split = 0;  // values per run; the last run may be shorter
};

// Blocks wanted in flight per SM, and the fewest values a block should sum
// (below that, the second pass and the block's start cost more than they
// save).
constexpr int kBnBlocksPerSm = 8;
constexpr int64_t kBnMinPerSplit = 2048;

// The most runs a channel is ever cut into on this GPU: what a layer
// allocates for its partial sums.
inline int max_bn_splits(int channels, int sms) {
  const int64_t wanted = int64_t(kBnBlocksPerSm) * std::max(sms, 1);
  return int(std::max<int64_t>(1, (wanted + channels - 1) / std::max(channels, 1)));
}

// values: the values of one channel in this call (images x H x W).
inline BnSplit plan_bn_split(int64_t values, int channels, int sms) {
  BnSplit p;
  if (values <= 0) return p;
  const int64_t by_size = std::max<int64_t>(1, values / kBnMinPerSplit);
  const int64_t splits = std::min<int64_t>(max_bn_splits(channels, sms), by_size);
  p.per_split = (values + splits - 1) / splits;
  // No empty run: as many runs as per_split needs.
  p.splits = int((values + p.per_split - 1) / p.per_split);
  return p;
}

}  // namespace ddp::nn
