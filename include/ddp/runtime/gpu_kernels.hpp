// ddp::GpuKernels: which of the GPU kernels not yet proven on a GPU a run
// takes (--gpu-kernels; docs/gpus.md, "Kernels not yet run"). Host code:
// the flag is read and checked on machines without a GPU too.
//
// Note [next kernels]: code written without a GPU lands behind
// `--gpu-kernels next` and becomes the default only once a GPU has run its
// tests and the benchmark. `next` holds several such pieces at once, so a
// run of `next` that fails on a GPU is narrowed down by leaving pieces out:
// `--gpu-kernels next,-graph-conv,-bn-act` is `next` without those two
// (scripts/gpu-check.sh does this by halving). Each piece is asked for by
// name where it is used (cuda::Context::next); `proven` (the default) takes
// none of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

enum class NextKernel {
  BnSplitSums,        // BatchNorm's sums over many blocks a channel (Note [batch norm sums])
  GraphConv,          // convolutions through cuDNN's graph API (Note [graph engines])
  ConvBiasSums,       // a convolution's bias gradient summed as BatchNorm's sums are
  BnAct,              // BatchNorm with its ReLU or residual add as one kernel (Note [claimed runs])
  ConvBn,             // a convolution and the BatchNorm after it as one kernel, 16 bits between them
                      // (Note [16-bit handoff])
  BiasInBn,           // that convolution's bias gradient summed in its BatchNorm's backward (Note [bias in backward])
  SyncBnOnDevice,     // SyncBatchNorm's sums over NCCL on the device
  OneRank,            // no collective at one rank
  LossScaleOnDevice,  // fp16's loss scaler deciding on the device (Note [loss scale on the device])
  ShardSums,          // --deterministic: BatchNorm's micro-shard sums in one launch (Note [shards in one launch])
  ShardsTogether,     // --deterministic: micro-shards' gradients taken together (Note [shard gradients together]),
                      // their losses in one launch
  CheckedRuns,        // --deterministic: micro-shards in one checked call (Note [checked runs])
  ShardStreams,       // --deterministic: micro-shards' weight gradients on side streams (Note [shard streams])
  StepGraphs,         // the steady step captured once as a CUDA graph and replayed (Note [step graphs])
  WarpRunSums,        // the split sums' second pass a warp a channel (Note [batch norm sums])
};

// Every piece, in the order above, and each one's name on the command line.
const std::vector<NextKernel>& next_kernels();
const char* name_of(NextKernel k);

class GpuKernels {
 public:
  static GpuKernels proven() { return GpuKernels(); }
  static GpuKernels next();  // every piece
  // "proven", "next", or "next,-NAME,..." (Note [next kernels]); throws
  // Error naming the flag, and the pieces where a name is not one.
  static GpuKernels parse(const std::string& spec);

  bool on(NextKernel k) const { return (on_ >> unsigned(k)) & 1u; }
  bool any() const { return on_ != 0; }
  GpuKernels without(NextKernel k) const;
  // "proven", "next", or "next without graph-conv, bn-act".
  std::string describe() const;

 private:
  uint32_t on_ = 0;
};

}  // namespace ddp
