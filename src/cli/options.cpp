#include "ddp/cli/options.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <cxxopts.hpp>

#include "ddp/core/error.hpp"
#include "ddp/nn/graph.hpp"  // known_models, model_graph, has_batch_norm
#include "ddp/runtime/gpu_kernels.hpp"

namespace ddp::cli {

namespace {

// Accepted ranges of the numeric flags (README's flag table says the same).
constexpr int64_t kMaxSynthetic = 10'000'000;  // 31 GB of float images
constexpr int kMaxEpochs = 1'000'000;
constexpr int kMaxBatch = 1 << 20;
constexpr int kMaxBucketCapMb = 1 << 20;         // 1 TiB
constexpr double kMinTimeoutSec = 0.001;         // 1 ms
constexpr int64_t kMaxTimeoutSec = 365 * 86400;  // a year: its milliseconds fit an int64 with room

// Whether a model has BatchNorm is its architecture's, whatever the input:
// asked of the graph for Fashion-MNIST's shape, which every known model takes.
bool has_batch_norm(const std::string& model) {
  return nn::has_batch_norm(nn::model_graph(model, {1, 28, 28}, 10));
}

void validate(const train::Config& c, int world_size) {
  auto usage = [](bool ok, auto&&... parts) {
    if (!ok) throw UsageError(detail::concat(parts...));
  };
  // lo <= v <= hi; false for NaN.
  auto range = [&](const char* flag, auto v, auto lo, auto hi, const char* unit = "") {
    usage(v >= lo && v <= hi, "--", flag, " ", v, " is out of range: it must be from ", lo, " to ", hi, unit);
  };
  const auto models = nn::known_models();
  std::string known;
  for (const auto& m : models) known += (known.empty() ? "" : ", ") + m;
  usage(std::find(models.begin(), models.end(), c.model) != models.end(), "unknown model '", c.model,
        "' (--model; known: ", known, ")");
  range("epochs", c.epochs, 1, kMaxEpochs);
  range("batch-size", c.batch_size, 1, kMaxBatch);
  if (c.deterministic_shards > 0) {
    const int k = c.deterministic_shards;
    range("deterministic-shards", k, 1, kMaxBatch);
    usage(c.batch_size % k == 0, "--deterministic-shards ", k, " must divide the global batch (--batch-size ",
          c.batch_size, ") into micro-shards of equal size");
    usage(k % world_size == 0, "--deterministic: ", world_size, " ranks cannot share ", k,
          " micro-shards (--deterministic-shards) evenly; the world sizes that reproduce this run are ",
          train::reproducing_world_sizes(k));
    usage(c.accumulate == 1, "--accumulate: --deterministic already takes each rank's batch one micro-shard at a "
          "time (", c.batch_size / k, " samples, --deterministic-shards ", k, "); drop --accumulate");
    usage(c.grad_compression == "none", "--grad-compression ", c.grad_compression,
          ": --deterministic sums gradients exactly, as integers; drop one of the two");
    // Timings differ from run to run and rank to rank, and so would the
    // algorithms, and with them the bits (Note [measured algorithms]).
    usage(!c.cudnn_benchmark, "--cudnn-benchmark chooses convolution algorithms by timing them, which differs from "
          "run to run and rank to rank: --deterministic needs the same algorithms everywhere; drop one of the two");
  }
  usage(c.batch_size % world_size == 0, "--batch-size ", c.batch_size,
        " is the global batch and must be divisible by the world size ", world_size, " (",
        c.batch_size, " % ", world_size, " = ", c.batch_size % world_size, ")");
  usage(std::isfinite(c.lr) && c.lr > 0, "--lr must be a positive number, got ", c.lr);
  usage(c.optimizer == "sgd" || c.optimizer == "adamw", "--optimizer must be sgd or adamw, got '", c.optimizer,
        "'");
  usage(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1, "--momentum must be in [0, 1), got ",
        c.momentum);
  usage(!c.nesterov || c.momentum > 0, "--nesterov needs --momentum > 0");
  usage(c.optimizer == "sgd" || (c.momentum == 0 && !c.nesterov),
        "--momentum and --nesterov are SGD's; AdamW's moments are set by --betas");
  usage(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "--weight-decay must be >= 0, got ",
        c.weight_decay);
  usage(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, "--betas ", c.beta1, ",", c.beta2,
        ": each must be in [0, 1)");
  usage(std::isfinite(c.eps) && c.eps > 0, "--eps must be a positive number, got ", c.eps);
  usage(c.lr_schedule == "constant" || c.lr_schedule == "step" || c.lr_schedule == "cosine",
        "--lr-schedule must be constant, step or cosine, got '", c.lr_schedule, "'");
  range("warmup-steps", c.warmup_steps, int64_t(0), int64_t(1) << 40, " steps");
  usage(c.lr_schedule == "step" || c.lr_step_size == 0, "--lr-step-size is for --lr-schedule step, not ",
        c.lr_schedule);
  usage(c.lr_schedule != "step" || c.lr_step_size > 0,
        "--lr-schedule step needs --lr-step-size N (optimizer steps between decays)");
  range("lr-step-size", c.lr_step_size, int64_t(0), int64_t(1) << 40, " steps");
  usage(std::isfinite(c.lr_gamma) && c.lr_gamma > 0 && c.lr_gamma <= 1, "--lr-gamma must be in (0, 1], got ",
        c.lr_gamma);
  usage(c.lr_schedule == "cosine" || c.lr_min == 0, "--lr-min is for --lr-schedule cosine, not ", c.lr_schedule);
  usage(std::isfinite(c.lr_min) && c.lr_min >= 0 && c.lr_min <= c.lr, "--lr-min must be from 0 to --lr (", c.lr,
        "), got ", c.lr_min);
  range("accumulate", c.accumulate, 1, kMaxBatch);
  range("log-every", c.log_every, int64_t(0), int64_t(1) << 40, " steps (0: the default)");
  if (c.batch_size % world_size == 0) {
    const int per_rank = c.batch_size / world_size;
    usage(per_rank % c.accumulate == 0, "--accumulate ", c.accumulate, " must divide the ", per_rank,
          " samples each rank takes per step (--batch-size ", c.batch_size, " over ", world_size, " ranks)");
  }
  usage(c.precision == "fp32" || c.precision == "tf32" || c.precision == "bf16" || c.precision == "fp16",
        "--precision must be fp32, tf32, bf16 or fp16, got '", c.precision, "'");
  range("init-scale", c.init_scale, 0x1p-24, 0x1p120);
  range("growth-interval", c.growth_interval, int64_t(1), int64_t(1) << 40, " steps");
  usage(c.grad_compression == "none" || c.grad_compression == "fp16" || c.grad_compression == "bf16",
        "--grad-compression must be none, fp16 or bf16, got '", c.grad_compression, "'");
  try {
    GpuKernels::parse(c.gpu_kernels);
  } catch (const Error& e) {
    usage(false, e.what());
  }
  usage(std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
        "--clip-grad-norm must be a positive number (0: no clipping), got ", c.clip_grad_norm);
  usage(c.bucket_cap_mb > 0 && c.bucket_cap_mb <= kMaxBucketCapMb, "--bucket-cap-mb ", c.bucket_cap_mb,
        " is out of range: it must be more than 0 and at most ", kMaxBucketCapMb, " (MiB)");
  range("timeout", c.timeout_sec, kMinTimeoutSec, kMaxTimeoutSec, " seconds");
  range("preflight-timeout", c.preflight_timeout_sec, kMinTimeoutSec, kMaxTimeoutSec, " seconds");
  range("synthetic", c.synthetic, int64_t(0), kMaxSynthetic, " images (0: the default)");
  range("train-limit", c.train_limit, int64_t(0), int64_t(UINT32_MAX), " images (0: all)");
  usage(c.data_dir.empty() || c.synthetic == 0, "--data-dir and --synthetic are exclusive: name one dataset");
  usage(c.device == "auto" || c.device == "cpu" || c.device == "cuda", "--device must be auto, cpu or cuda, got '",
        c.device, "'");
  usage(c.backend == "auto" || c.backend == "mpi" || c.backend == "nccl",
        "--backend must be auto, mpi or nccl, got '", c.backend, "'");
  range("checkpoint-every", c.checkpoint_every, int64_t(0), std::numeric_limits<int64_t>::max());
  range("keep-checkpoints", c.keep_checkpoints, 1, std::numeric_limits<int>::max());
  usage(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(), "--checkpoint-every needs --checkpoint-dir");
  usage(c.resume != "auto" || !c.checkpoint_dir.empty(),
        "--resume auto looks in --checkpoint-dir, which is not given");
  usage(c.backend != "nccl" || c.device != "cpu", "--backend nccl runs on GPUs and --device cpu was asked for; use "
        "--backend mpi (or auto) with --device cpu");
#if !DDP_HAVE_CUDA
  usage(c.device != "cuda", "--device cuda: this build of ddp_train has no CUDA backend (built without the CUDA "
        "toolkit); use --device cpu");
  usage(c.backend != "nccl", "--backend nccl needs GPUs (--device cuda), which this build does not have (built "
        "without the CUDA toolkit); use --backend mpi");
#endif
  // Last, so that a flag wrong in itself is named first.
  usage(c.deterministic_shards == 0 || c.sync_bn || !has_batch_norm(c.model), "--deterministic: model ", c.model,
        " has BatchNorm, whose statistics over each rank's own batch depend on the world size; add --sync-bn to "
        "take them over the global batch");
  usage(!c.debug_collectives || c.device != "cuda", train::kDebugCollectivesOnGpus);
}

// Numbers are read as text and converted here, so that a bad value is
// reported with the flag it was given to (cxxopts names only the value).
template <typename T>
void read_number(const cxxopts::ParseResult& r, const std::string& flag, T& out) {
  if (!r.count(flag)) return;
  const std::string text = r[flag].as<std::string>();
  size_t used = 0;
  try {
    if constexpr (std::is_floating_point_v<T>) {
      out = static_cast<T>(std::stod(text, &used));
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!text.empty() && text[0] == '-') throw std::invalid_argument("negative");
      out = static_cast<T>(std::stoull(text, &used));
    } else {
      const long long v = std::stoll(text, &used);
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) throw std::out_of_range(text);
      out = static_cast<T>(v);
    }
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw UsageError("--" + flag + ": '" + text + "' is not " +
                     (std::is_floating_point_v<T> ? "a number" : "a whole number") + " (see --help)");
}

// "A<sep>B" as two numbers; false unless the text is exactly that.
template <typename T>
bool parse_pair(const std::string& text, char sep, T& a, T& b) {
  const size_t at = text.find(sep);
  if (at == std::string::npos) return false;
  size_t u1 = 0, u2 = 0;
  try {
    if constexpr (std::is_floating_point_v<T>) {
      a = static_cast<T>(std::stod(text.substr(0, at), &u1));
      b = static_cast<T>(std::stod(text.substr(at + 1), &u2));
    } else {
      a = static_cast<T>(std::stoll(text.substr(0, at), &u1));
      b = static_cast<T>(std::stoll(text.substr(at + 1), &u2));
    }
  } catch (const std::exception&) {
    return false;
  }
  return u1 == at && u2 == text.size() - at - 1;
}

}  // namespace

Parsed parse_options(int argc, char** argv, int world_size) {
  train::Config c;
  cxxopts::Options opts("ddp_train", "Data-parallel training: one process per rank, launched by mpirun or srun.");
  const auto text = [] { return cxxopts::value<std::string>(); };
  // clang-format off
  opts.add_options()
    ("model", "lenet, mlp or resnet18", cxxopts::value(c.model)->default_value(c.model))
    ("data-dir", "directory with Fashion-MNIST/MNIST IDX files (gzip or raw)", cxxopts::value(c.data_dir))
    ("synthetic", "train on N generated images (default when no --data-dir: " +
         std::to_string(train::kDefaultSynthetic) + ")", text())
    ("train-limit", "train on the first N training images only (default 0: all)", text())
    ("epochs", "epochs to train (default " + std::to_string(c.epochs) + ")", text())
    ("batch-size", "GLOBAL batch size, split evenly over ranks (default " + std::to_string(c.batch_size) + ")", text())
    ("lr", "learning rate (default 0.2)", text())
    ("optimizer", "sgd or adamw (torch.optim.SGD / AdamW)", cxxopts::value(c.optimizer)->default_value(c.optimizer))
    ("momentum", "SGD momentum (default 0)", text())
    ("nesterov", "Nesterov momentum", cxxopts::value(c.nesterov))
    ("weight-decay", "weight decay: SGD's L2 term (default 0), AdamW's decoupled decay (default 0.01)", text())
    ("betas", "AdamW's B1,B2 (default 0.9,0.999)", text())
    ("eps", "AdamW's epsilon (default 1e-8)", text())
    ("no-decay-norm-bias", "no weight decay on biases and BatchNorm parameters", cxxopts::value(c.no_decay_norm_bias))
    ("lr-schedule", "constant, step or cosine, over optimizer steps", cxxopts::value(c.lr_schedule)->default_value(c.lr_schedule))
    ("warmup-steps", "linear warm-up over the first N steps (default 0)", text())
    ("lr-step-size", "step schedule: multiply the rate by --lr-gamma every N steps", text())
    ("lr-gamma", "step schedule's factor (default 0.1)", text())
    ("lr-min", "cosine schedule's rate at the last step (default 0)", text())
    ("scale-lr", "linear scaling rule: lr x global batch / 256", cxxopts::value(c.scale_lr))
    ("accumulate", "micro-batches per optimizer step; only the last all-reduces (default 1)", text())
    ("clip-grad-norm", "clip the global gradient L2 norm to X after the all-reduce (default 0: off)", text())
    ("precision", "fp32, tf32, bf16 or fp16: what convolutions and linear layers compute in (tf32: GPU "
      "tensor cores, fp32 on CPUs; bf16, fp16: autocast, on CPUs rounded, not faster)",
         cxxopts::value(c.precision)->default_value(c.precision))
    ("init-scale", "fp16: the loss scaler's first scale (default 65536, GradScaler's init_scale)", text())
    ("growth-interval", "fp16: good steps after which the loss scale doubles (default 2000)", text())
    ("grad-compression", "none, fp16 or bf16: gradients all-reduced in 16 bits (half the bytes)",
         cxxopts::value(c.grad_compression)->default_value(c.grad_compression))
    ("seed", "seed of initial weights, shuffling and synthetic data (default 0)", text())
    ("backend", "auto, mpi or nccl", cxxopts::value(c.backend)->default_value(c.backend))
    ("device", "auto, cpu or cuda", cxxopts::value(c.device)->default_value(c.device))
    ("bucket-cap-mb", "gradient bucket size in MiB; the first bucket is at most 1 MiB (default 25)", text())
    ("no-overlap", "all-reduce every bucket after backward instead of during it", cxxopts::value<bool>())
    ("sync-bn", "BatchNorm statistics over all ranks' batches (SyncBatchNorm), not each rank's own",
         cxxopts::value(c.sync_bn))
    ("cudnn-benchmark", "GPUs: time cuDNN's convolution algorithms once per geometry and run the fastest "
                        "(a deterministic one within 5% of it), as torch.backends.cudnn.benchmark",
         cxxopts::value(c.cudnn_benchmark))
    ("gpu-kernels", "GPUs: proven (the kernels a GPU has run through the tests and the benchmark), next (also "
                    "those written since) or reference (the first kernels alone); proven,-NAME,... and "
                    "next,-NAME,... leave the named ones out (docs/gpus.md)",
         cxxopts::value(c.gpu_kernels)->default_value(c.gpu_kernels))
    ("channels-last", "GPUs: activations and their gradients NHWC, as torch.channels_last, where the model "
                      "allows it (ResNet-18; LeNet stays NCHW; docs/gpus.md)",
         cxxopts::value(c.channels_last))
    ("deterministic", "bitwise the same training at every world size that divides --deterministic-shards, "
                      "and on resume at another one (CPU)", cxxopts::value<bool>())
    ("deterministic-shards", "K: --deterministic's micro-shards per global batch; world sizes must divide it "
                             "(default 16, or the largest power of two below it dividing --batch-size)", text())
    ("timeout", "seconds a collective may wait, or a rank go unheard, before the watchdog ends the job "
                "naming the ranks that did not arrive (default 300)", text())
    ("debug-collectives", "before each collective, check every rank issues the same one (costs a round trip each)",
         cxxopts::value(c.debug_collectives))
    ("preflight-timeout", "seconds the start-up check that every rank can reach the others may take "
         "(default 60)", text())
    ("metrics-out", "write one JSON object per epoch to FILE", cxxopts::value(c.metrics_out))
    ("output-model", "write the final parameters to FILE.safetensors", cxxopts::value(c.output_model))
    ("quiet", "no per-epoch or progress lines", cxxopts::value(c.quiet))
    ("log-every", "progress every N steps (default: a live line on a terminal, else 4 lines an epoch)", text())
    ("trace", "Chrome trace JSON of each rank's steps to FILE (FILE.rankR.json; Perfetto, chrome://tracing)",
         cxxopts::value(c.trace))
    ("trace-steps", "A:B: the global steps --trace records, inclusive (default 1:50)", text())
    ("tensorboard", "TensorBoard event files in DIR (rank 0): scalars per step and per epoch",
         cxxopts::value(c.tensorboard))
    ("checkpoint-dir", "rank 0 writes checkpoints here (at every epoch end)", cxxopts::value(c.checkpoint_dir))
    ("checkpoint-every", "also checkpoint every N global steps (default 0: epoch ends only)", text())
    ("keep-checkpoints", "newest checkpoints kept in --checkpoint-dir (default 3)", text())
    ("resume", "auto (newest valid checkpoint in --checkpoint-dir, else a fresh start) or a checkpoint FILE",
         cxxopts::value(c.resume))
    ("h,help", "print this help");
  // clang-format on
  Parsed parsed;
  try {
    auto result = opts.parse(argc, argv);
    if (result.count("help")) {
      parsed.help = opts.help();
      return parsed;
    }
    if (!result.unmatched().empty())
      throw UsageError("unexpected argument '" + result.unmatched().front() + "' (see --help)");
    read_number(result, "synthetic", c.synthetic);
    read_number(result, "train-limit", c.train_limit);
    read_number(result, "epochs", c.epochs);
    read_number(result, "batch-size", c.batch_size);
    read_number(result, "lr", c.lr);
    read_number(result, "momentum", c.momentum);
    read_number(result, "weight-decay", c.weight_decay);
    if (c.optimizer == "adamw" && !result.count("weight-decay")) c.weight_decay = 0.01;  // torch.optim.AdamW's
    if (result.count("betas")) {
      const std::string b = result["betas"].as<std::string>();
      if (!parse_pair(b, ',', c.beta1, c.beta2))
        throw UsageError("--betas: '" + b + "' is not two numbers B1,B2 (e.g. 0.9,0.999)");
    }
    read_number(result, "eps", c.eps);
    if (c.optimizer != "adamw" && (result.count("betas") || result.count("eps")))
      throw UsageError("--betas and --eps are AdamW's; add --optimizer adamw");
    read_number(result, "warmup-steps", c.warmup_steps);
    read_number(result, "lr-step-size", c.lr_step_size);
    read_number(result, "lr-gamma", c.lr_gamma);
    read_number(result, "lr-min", c.lr_min);
    read_number(result, "accumulate", c.accumulate);
    read_number(result, "clip-grad-norm", c.clip_grad_norm);
    if ((result.count("init-scale") || result.count("growth-interval")) && c.precision != "fp16")
      throw UsageError("--init-scale and --growth-interval set --precision fp16's loss scaler; add --precision "
                       "fp16 (bf16 and fp32 need no loss scaling)");
    read_number(result, "init-scale", c.init_scale);
    read_number(result, "growth-interval", c.growth_interval);
    read_number(result, "log-every", c.log_every);
    if (result.count("trace-steps")) {
      const std::string w = result["trace-steps"].as<std::string>();
      if (!parse_pair(w, ':', c.trace_first, c.trace_last) || c.trace_first < 1 || c.trace_last < c.trace_first)
        throw UsageError("--trace-steps: '" + w + "' is not A:B with 1 <= A <= B (global steps, e.g. 10:20)");
      if (c.trace.empty()) throw UsageError("--trace-steps says which steps --trace records; add --trace FILE");
    }
    read_number(result, "seed", c.seed);
    read_number(result, "bucket-cap-mb", c.bucket_cap_mb);
    read_number(result, "timeout", c.timeout_sec);
    read_number(result, "preflight-timeout", c.preflight_timeout_sec);
    read_number(result, "checkpoint-every", c.checkpoint_every);
    read_number(result, "keep-checkpoints", c.keep_checkpoints);
    c.overlap = result.count("no-overlap") == 0;
    if (result.count("deterministic")) {
      c.deterministic_shards = 16;
      while (c.batch_size % c.deterministic_shards != 0) c.deterministic_shards /= 2;
      read_number(result, "deterministic-shards", c.deterministic_shards);
      // 0 would read as "off" below (validate); --deterministic asked for on.
      if (c.deterministic_shards < 1)
        throw UsageError(detail::concat("--deterministic-shards ", c.deterministic_shards,
                                        " is out of range: it must be from 1 to ", kMaxBatch));
    } else if (result.count("deterministic-shards")) {
      throw UsageError("--deterministic-shards sets --deterministic's micro-shards; add --deterministic");
    }
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + " (see --help)");
  }
  validate(c, world_size);
  parsed.config = c;
  return parsed;
}

}  // namespace ddp::cli
