#include "ddp/cli/options.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <cxxopts.hpp>

#include "ddp/core/error.hpp"
#include "ddp/nn/model.hpp"

namespace ddp::cli {

namespace {

// Accepted ranges of the numeric flags (README's flag table says the same).
constexpr int64_t kMaxSynthetic = 10'000'000;  // 31 GB of float images
constexpr int kMaxEpochs = 1'000'000;
constexpr int kMaxBatch = 1 << 20;
constexpr int kMaxBucketCapMb = 1 << 20;         // 1 TiB
constexpr double kMinTimeoutSec = 0.001;         // 1 ms
constexpr int64_t kMaxTimeoutSec = 365 * 86400;  // a year: its milliseconds fit an int64 with room

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
  usage(c.batch_size % world_size == 0, "--batch-size ", c.batch_size,
        " is the global batch and must be divisible by the world size ", world_size, " (",
        c.batch_size, " % ", world_size, " = ", c.batch_size % world_size, ")");
  usage(std::isfinite(c.lr) && c.lr > 0, "--lr must be a positive number, got ", c.lr);
  usage(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1, "--momentum must be in [0, 1), got ",
        c.momentum);
  usage(!c.nesterov || c.momentum > 0, "--nesterov needs --momentum > 0");
  usage(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "--weight-decay must be >= 0, got ",
        c.weight_decay);
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
    ("momentum", "SGD momentum (default 0)", text())
    ("nesterov", "Nesterov momentum", cxxopts::value(c.nesterov))
    ("weight-decay", "L2 weight decay (default 0)", text())
    ("seed", "seed of initial weights, shuffling and synthetic data (default 0)", text())
    ("backend", "auto, mpi or nccl", cxxopts::value(c.backend)->default_value(c.backend))
    ("device", "auto, cpu or cuda", cxxopts::value(c.device)->default_value(c.device))
    ("bucket-cap-mb", "gradient bucket size in MiB; the first bucket is at most 1 MiB (default 25)", text())
    ("no-overlap", "all-reduce every bucket after backward instead of during it", cxxopts::value<bool>())
    ("sync-bn", "BatchNorm statistics over all ranks' batches (SyncBatchNorm), not each rank's own",
         cxxopts::value(c.sync_bn))
    ("timeout", "seconds any collective may take before the job is ended (default 300)", text())
    ("preflight-timeout", "seconds the start-up check that every rank can reach the others may take "
         "(default 60)", text())
    ("metrics-out", "write one JSON object per epoch to FILE", cxxopts::value(c.metrics_out))
    ("output-model", "write the final parameters to FILE.safetensors", cxxopts::value(c.output_model))
    ("quiet", "no per-epoch lines", cxxopts::value(c.quiet))
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
    read_number(result, "seed", c.seed);
    read_number(result, "bucket-cap-mb", c.bucket_cap_mb);
    read_number(result, "timeout", c.timeout_sec);
    read_number(result, "preflight-timeout", c.preflight_timeout_sec);
    read_number(result, "checkpoint-every", c.checkpoint_every);
    read_number(result, "keep-checkpoints", c.keep_checkpoints);
    c.overlap = result.count("no-overlap") == 0;
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + " (see --help)");
  }
  validate(c, world_size);
  parsed.config = c;
  return parsed;
}

}  // namespace ddp::cli
