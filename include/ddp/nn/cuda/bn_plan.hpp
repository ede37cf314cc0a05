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
// channel's runs in run order (with --gpu-kernels proven's warp-run-sums a
// warp a channel: lane l adds runs l, l + 32, ... in order, then the lanes'
// sums in a fixed tree; NHWC cuts a channel into hundreds of runs, too many
// for one thread). The cut depends only on the number of values,
// the channels and the GPU's SM count, never on timing: a call's sums repeat
// bit for bit, and a micro-shard's sums (--deterministic) are the same at
// every world size of GPUs with as many SMs (another GPU model, or a MIG
// slice, cuts them otherwise).
//
// Note [shards in one launch]: --deterministic sums each micro-shard of 16 on
// its own (Note [micro-shards], deterministic/shards.hpp), one launch pair a
// micro-shard and sum on the proven path. With the split sums (--gpu-kernels
// next) one launch takes them all: a third grid dimension is the
// micro-shard, each block offsets its pointers to its micro-shard's values
// and its runs' slots, and the cut is the plan of one micro-shard's values,
// so every block sums exactly what it would in a launch of its micro-shard
// alone: the same bits, at every world size. The second pass adds the runs
// of every micro-shard's channels at once.
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

// Note [channels last sums]: an NHWC tensor (Note [channels last],
// nn/layout.hpp) is rows (images x pixels) of c channels, a channel's values
// c floats apart. A block takes kNhwcGroup consecutive channels
// (a warp reads 128 contiguous bytes of a row) of a run of rows; its
// kNhwcWarps warps take interleaved rows, each thread summing in double in
// row order, and the warps' sums are added in warp order; the second pass
// adds each channel's runs in run order, as Note [batch norm sums]. The cut
// depends only on rows, channels and the SM count: the same bits every call.
constexpr int kNhwcGroup = 32, kNhwcWarps = 8;

inline int nhwc_channel_groups(int channels) { return (std::max(channels, 1) + kNhwcGroup - 1) / kNhwcGroup; }

// rows: images x pixels of this call. A block's run is at least
// kBnMinPerSplit values (rows x the group's channels), as plan_bn_split's.
inline BnSplit plan_nhwc_split(int64_t rows, int channels, int sms) {
  BnSplit p;
  if (rows <= 0) return p;
  const int64_t width = std::min(std::max(channels, 1), kNhwcGroup);
  const int64_t by_size = std::max<int64_t>(1, rows * width / kBnMinPerSplit);
  const int64_t splits = std::min<int64_t>(max_bn_splits(nhwc_channel_groups(channels), sms), by_size);
  p.per_split = (rows + splits - 1) / splits;
  p.splits = int((rows + p.per_split - 1) / p.per_split);
  return p;
}

// The most runs a channel is cut into in either layout: what a layer
// allocates for its partial sums (c x this many doubles a sum).
inline int max_sum_runs(int channels, int sms) {
  return std::max(max_bn_splits(channels, sms), max_bn_splits(nhwc_channel_groups(channels), sms));
}

}  // namespace ddp::nn
