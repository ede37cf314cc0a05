// ddp::train::StepGraphPlan: when a GPU rank captures its training step as a
// CUDA graph, replays it, or runs it as issued. Host code, tested on the
// CPU; the capture and replay are replica_cuda.cu's.
//
// Note [step graphs]: a training step issues hundreds of kernels, copies and
// NCCL calls; captured once (cudaStreamBeginCapture on the compute stream,
// the comm stream's all-reduces joined by their events) and replayed with one
// cudaGraphLaunch, the host no longer launches them one by one and the GPU
// no longer waits between them where launching is slower than running
// (small layers, small batches, many micro-batches). What the step issues
// must then not change from one step to the next:
//
//  - The memory it reads and writes. The batch arrives in one of the pinned
//    slots' device buffers, so a graph is kept per (inputs, labels, batch)
//    — a StepKey — and a step of another shape (the last partial batch) has
//    a key of its own. Memory freed or regrown (a larger batch reserving
//    the model's activations, a workspace grown by a new geometry: the
//    context's generation, cuda::Context::generation) makes every graph
//    captured before it stale: it is never replayed again.
//  - The plans, algorithm choices and timed engines, made at a geometry's
//    first calls: a key is captured only after kWarmup steps of it ran as
//    issued, the last of them without a change of generation.
//  - The learning rate and the optimizer's step count, which change every
//    step: the optimizer's kernels read them from the device's memory,
//    written before each replay (Optimizer::stage_scalars). A step is two
//    graphs, its passes (forward, loss, backward with the all-reduces) and
//    its optimizer, and the host takes its turn between them while the
//    passes run: the scalars, and with --precision fp16's loss scale on the
//    device the last step's outcome (a skipped step is taken back before
//    this one's count is staged; Note [loss scale on the device]), whose
//    flag the captured optimizer copies out with an event recorded as the
//    graph runs (an external record).
//  - What the host keeps of a step: the BatchNorm counters, the optimizer's
//    and the reducer's counts and the step's sums are advanced by what the
//    captured step advanced them by (Replica).
//  - What every rank does. NCCL asks that a collective be captured on every
//    rank or on none, and each rank's graph be replayed with its peers'. The
//    ranks' steps are alike (the same shapes, in the same slots: each
//    training epoch starts at the first slot, Backend::restart_slots), so
//    their plans agree, but an evaluation's last batch differs between
//    ranks and may move memory on some: at each epoch's start the ranks
//    agree (a host all-reduce) and every rank drops its graphs where one
//    holds a stale graph. Memory that moves on one rank in the middle of an
//    epoch while its graphs are held is an error at several ranks.
//
// What a replay cannot do runs as issued, said once on rank 0 (at start-up;
// the trace's window at its first step): the trace's window (its spans are
// the host's launches), --deterministic, --precision fp16's loss scaler on
// the host (without loss-scale-on-device), the staged mpi backend (its
// all-reduces are the host's), and SyncBatchNorm unless its sums stay on
// the device (sync-bn-on-device). A capture that fails ends the job with
// cuDNN's or CUDA's words and the flag that leaves graphs out
// (--gpu-kernels next,-step-graphs): a rank that went on as issued could
// have its NCCL calls out of step with its peers'. Memory asked for or
// freed through the context while a step is captured is an error
// (cuda::Context::set_capturing): a graph's allocation would outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace ddp::train {

// A step's graphs: its passes (part 0: forward, loss, backward with the
// all-reduces) and its optimizer (part 1), the host's turn between them.
struct StepKey {
  const void* x = nullptr;
  const void* y = nullptr;
  int batch = 0;
  int part = 0;
  bool operator<(const StepKey& o) const {
    return std::tie(x, y, batch, part) < std::tie(o.x, o.y, o.batch, o.part);
  }
};

enum class StepRun { kIssue, kCapture, kReplay };

class StepGraphPlan {
 public:
  // Eager steps of a key before it is captured.
  static constexpr int kWarmup = 2;
  // Graphs kept at once (two pinned slots, and a shape or two more): a
  // key beyond them runs as issued.
  static constexpr size_t kMaxGraphs = 4;

  // How the step of `key` runs, the context's generation being `generation`.
  // A graph of `key` captured at another generation is stale: `*drop` is
  // set and the caller destroys it (the step then runs as issued).
  StepRun decide(const StepKey& key, uint64_t generation, bool* drop);
  // After the step: it ran as `run`, the generation `before` it and `after`.
  // A capture whose generation changed while it was captured is dropped at
  // its first decide (it is stale).
  void done(const StepKey& key, StepRun run, uint64_t before, uint64_t after);
  // The graphs held now, and whether one of them is stale at `generation`.
  size_t graphs() const;
  bool stale(uint64_t generation) const;

 private:
  struct Entry {
    int clean = 0;  // steps as issued in a row, the last without a change of generation
    bool graph = false;
    uint64_t generation = 0;  // the graph's
  };
  std::map<StepKey, Entry> keys_;
};

}  // namespace ddp::train
