// ddp::train::Config: everything a run is told on the command line.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::train {

struct Config {
  std::string model = "lenet";
  std::string data_dir;          // IDX files; empty means synthetic data
  int64_t synthetic = 0;         // > 0: generated dataset of this many training images
  int64_t train_limit = 0;       // > 0: train on the first N training samples only
  int epochs = 10;
  int batch_size = 256;          // global batch, split evenly over ranks
  double lr = 0.2;               // the base rate (before --scale-lr and the schedule)
  std::string optimizer = "sgd";  // sgd | adamw
  double momentum = 0.0;
  double weight_decay = 0.0;     // AdamW's default, when not given, is PyTorch's 0.01
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  bool no_decay_norm_bias = false;  // no weight decay on 1-d parameters (biases, norms)
  std::string lr_schedule = "constant";  // constant | step | cosine
  int64_t warmup_steps = 0;
  int64_t lr_step_size = 0;      // step: steps between decays
  double lr_gamma = 0.1;         // step: factor per decay
  double lr_min = 0.0;           // cosine: the last step's rate
  bool scale_lr = false;         // lr x global batch / 256
  int accumulate = 1;            // micro-batches per optimizer step (per rank)
  double clip_grad_norm = 0.0;   // > 0: clip the global gradient L2 norm to this
  std::string grad_compression = "none";  // none | fp16 | bf16: what gradients travel as
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (Note [mixed precision], nn/precision.hpp)
  double init_scale = 65536.0;     // fp16's loss scaler (optim/grad_scaler.hpp): its first scale
  int64_t growth_interval = 2000;  // and the good steps after which it doubles
  uint64_t seed = 0;
  std::string backend = "auto";  // auto | mpi | nccl
  std::string device = "auto";   // auto | cpu | cuda
  double bucket_cap_mb = 25.0;
  bool overlap = true;           // false: every all-reduce after backward (--no-overlap)
  bool sync_bn = false;          // BatchNorm statistics over all ranks (--sync-bn)
  // GPUs: convolution algorithms chosen by timing them (Note [measured
  // algorithms], nn/cuda/conv_algo.hpp), not by cuDNN's heuristics.
  bool cudnn_benchmark = false;
  // GPUs: "proven", the kernels a GPU has run through the tests and the
  // benchmark, or "next", also those written since, or "reference", the
  // first kernels alone; "proven,-NAME,..." and "next,-NAME,..." leave some
  // out (Note [next kernels], runtime/gpu_kernels.hpp).
  std::string gpu_kernels = "proven";
  // GPUs: activations NHWC where the model allows it (Note [channels last],
  // nn/layout.hpp).
  bool channels_last = false;
  // --deterministic: the global batch in this many micro-shards, gradients
  // summed in fixed point, so every world size dividing it gives the same bits
  // (deterministic/exact_sum.hpp). 0: off.
  int deterministic_shards = 0;
  double timeout_sec = 300.0;    // bound on every collective
  bool debug_collectives = false;  // compare every rank's next collective before each one
  double preflight_timeout_sec = 60.0;  // bound on the start-up check that every rank is reachable
  std::string metrics_out;       // JSON lines, one per epoch
  std::string output_model;      // safetensors of the final parameters
  bool quiet = false;            // no per-epoch or progress lines (summary still printed)
  int64_t log_every = 0;         // progress every N steps (0: every step on a terminal, else 4 an epoch)
  std::string trace;             // Chrome trace JSON, one file per rank (the rank in its name)
  int64_t trace_first = 1, trace_last = 50;  // --trace-steps A:B, global steps, inclusive
  std::string tensorboard;       // TensorBoard event files here (rank 0)

  // Checkpoints (rank 0 writes; every rank resumes).
  std::string checkpoint_dir;    // empty: no checkpoints
  int64_t checkpoint_every = 0;  // also every N global steps (0: only at epoch ends)
  int keep_checkpoints = 3;
  std::string resume;            // "", "auto" (newest valid in checkpoint_dir) or a file
};

// "1, 2, 4, 8 and 16": the world sizes that share `shards` micro-shards
// evenly, which reproduce a --deterministic run.
inline std::string reproducing_world_sizes(int shards) {
  std::string s;
  int last = 0;
  for (int i = 1; i <= shards; ++i)
    if (shards % i == 0) last = i;
  for (int i = 1; i <= shards; ++i)
    if (shards % i == 0) s += (s.empty() ? "" : i == last ? " and " : ", ") + std::to_string(i);
  return s;
}

// --debug-collectives checks the MPI backend's communicator only. GPUs are
// refused it by the flags' validation where --device cuda asks for them, and
// by the trainer's set-up where --device auto finds them.
inline constexpr const char* kDebugCollectivesOnGpus =
    "--debug-collectives checks the MPI backend's collectives; with GPUs (--device cuda) it is not available yet: "
    "use --device cpu to debug the order of collectives";

// Exit status of a run stopped by SIGTERM/SIGINT after it wrote a checkpoint:
// rerunning the same command with --resume auto continues it.
constexpr int kExitStoppedBySignal = 75;

// The built-in default when no data is named: a generated dataset of this
// size, so `mpirun -np 4 ddp_train` runs with no download.
constexpr int64_t kDefaultSynthetic = 12000;

}  // namespace ddp::train
