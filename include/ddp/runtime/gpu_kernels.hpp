// ddp::GpuKernels: which pieces of GPU code written after the first kernels
// a run takes (--gpu-kernels; docs/gpus.md, "Kernels not yet run"). Host
// code: the flag is read and checked on machines without a GPU too.
//
// Note [next kernels]: code written without a GPU lands behind
// `--gpu-kernels next` and becomes the default (`proven`) only once a GPU has
// run its tests and the benchmark with it. `next` holds several such pieces
// at once, so a run of `next` that fails on a GPU is narrowed down by leaving
// pieces out: `--gpu-kernels next,-graph-conv,-bn-act` is `next` without
// those two (scripts/gpu-check.sh does this by halving), and
// `proven,-NAME` is the default without a piece. `reference` takes none: the
// first kernels, which each piece's GPU tests compare it with. Each piece is
// asked for by name where it is used (cuda::Context::next). Made proven
// (2026-11-28, an H200: every GPU test and both learning tests with `next`,
// and the benchmark): every piece but step-graphs, which stays in `next`
// (a step's host times are then its launches, and a rank whose device memory
// moves mid-epoch ends the job: Note [step graphs]).
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
  static GpuKernels reference() { return GpuKernels(); }  // no piece
  static GpuKernels proven();  // the pieces a GPU has run (the default)
  static GpuKernels next();    // every piece
  // "reference", "proven", "next", "proven,-NAME,..." or "next,-NAME,..."
  // (Note [next kernels]); throws Error naming the flag, and the pieces where
  // a name is not one.
  static GpuKernels parse(const std::string& spec);

  bool on(NextKernel k) const { return (on_ >> unsigned(k)) & 1u; }
  bool any() const { return on_ != 0; }
  // Whether it takes a piece no GPU has run yet (one of next's, not proven's).
  bool beyond_proven() const { return (on_ & ~proven().on_) != 0; }
  GpuKernels without(NextKernel k) const;
  // "reference", "proven", "next", "proven without bn-act" or "next without
  // graph-conv, bn-act".
  std::string describe() const;
  // For a GPU run's start-up line: "" for the default, else "; --gpu-kernels
  // next: also kernels not yet proven on a GPU (docs/gpus.md)" and the like.
  std::string startup_note() const;

 private:
  uint32_t on_ = 0;
};

}  // namespace ddp
