// The start-up table (startup_table.hpp).
#include "ddp/train/startup_table.hpp"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"           // DDP_CHECK
#include "ddp/reducer/reducer.hpp"          // Reducer: the bucket count
#include "ddp/nn/graph.hpp"             // has_batch_norm
#include "ddp/nn/layout.hpp"            // plan_layout: Note [channels last]
#include "ddp/optim/optimizer.hpp"      // describe: the optimizer's line
#include "ddp/runtime/gpu_kernels.hpp"  // GpuKernels: Note [next kernels]

namespace ddp::train {

namespace {

// What each rank tells rank 0 at start-up (fixed size for allgather).
struct RankInfo {
  char host[64];
  char device[16];
  char blas[192];
  int32_t local_rank, local_size, threads;
  int64_t shard, steps;
};

// The BLAS kernels the CPU ranks run (Note [BLAS kernels]): one line when
// every rank runs the same, else one per rank.
void describe_blas(const std::vector<RankInfo>& ranks, std::ostream& out) {
  bool same = true;
  for (const RankInfo& r : ranks) same = same && std::strcmp(r.blas, ranks[0].blas) == 0;
  if (same) {
    if (ranks[0].blas[0]) out << " BLAS: " << ranks[0].blas << "\n";
    return;
  }
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].blas[0]) out << " rank " << r << " BLAS: " << ranks[r].blas << "\n";
}

// One table of every rank, so a misconfigured job is visible in its first
// lines; and the agreement check: every rank must take the same number of
// steps per epoch, or the collectives of the last steps would never match.
void startup_check(Replica& replica, const World& world, const Config& cfg, const optim::LrSchedule& schedule,
                   int64_t shard, int64_t steps, std::ostream& out) {
  comm::Communicator& comm = replica.comm();
  const nn::Graph& graph = replica.graph();
  const Reducer& reducer = replica.reducer();
  RankInfo mine{};
  std::snprintf(mine.host, sizeof(mine.host), "%s", world.host.c_str());
  std::snprintf(mine.device, sizeof(mine.device), "%s", replica.device().c_str());
  std::snprintf(mine.blas, sizeof(mine.blas), "%s", world.blas.c_str());
  mine.local_rank = world.local_rank;
  mine.local_size = world.local_size;
  mine.threads = replica.threads();
  mine.shard = shard;
  mine.steps = steps;
  const std::vector<char> all = comm.allgather(&mine, sizeof(mine), "start-up rank table");
  std::vector<RankInfo> ranks(world.size);
  std::memcpy(ranks.data(), all.data(), all.size());
  for (int r = 1; r < world.size; ++r)
    DDP_CHECK(ranks[r].steps == ranks[0].steps, "ranks disagree on steps per epoch: rank 0 has ",
              ranks[0].steps, ", rank ", r, " has ", ranks[r].steps, " (shards ", ranks[0].shard,
              " and ", ranks[r].shard, " samples); refusing to start");
  if (world.rank != 0) return;
  char line[256];
  std::snprintf(line, sizeof(line),
                "ddp_train: %d rank%s, backend %s, device %s, model %s (%zu parameters, %zu bucket%s), "
                "global batch %d (%d per rank), %lld steps per epoch\n",
                world.size, world.size == 1 ? "" : "s", comm.backend(), ranks[0].device, cfg.model.c_str(),
                graph.parameter_count, reducer.buckets().size(), reducer.buckets().size() == 1 ? "" : "s",
                cfg.batch_size, cfg.batch_size / world.size, static_cast<long long>(steps));
  out << line;
  out << "ddp_train: optimizer " << optim::describe(replica.optimizer().options()) << "; lr " << schedule.describe();
  if (cfg.scale_lr)
    out << " (--scale-lr: " << cfg.lr << " x global batch " << cfg.batch_size << " / 256)";
  if (cfg.grad_compression != "none") out << "; gradients all-reduced as " << cfg.grad_compression;
  if (ranks[0].device != std::string("cpu"))
    out << "\nddp_train: convolution algorithms: "
        << (cfg.cudnn_benchmark ? "timed once per geometry (--cudnn-benchmark), the fastest, or a deterministic one "
                                  "within 5% of it"
                                : "cuDNN's heuristics' first deterministic one")
        << GpuKernels::parse(cfg.gpu_kernels).startup_note();
  if (cfg.channels_last) {
    const nn::LayoutPlan plan = nn::plan_layout(graph, true);
    out << "\nddp_train: --channels-last: "
        << (ranks[0].device == std::string("cpu") ? "GPUs only; CPUs keep NCHW"
            : plan.layout == nn::Layout::NHWC
                ? "activations and their gradients NHWC on the GPU, weights PyTorch's layout"
                : "the model stays NCHW: " + plan.why);
  }
  if (cfg.precision == "tf32") {
    out << "\nddp_train: precision tf32: convolutions and linear layers multiply on TF32 tensor cores (mantissas cut "
           "to 10 bits) and accumulate in fp32; everything else fp32"
        << (ranks[0].device == std::string("cpu") ? "; CPUs have no TF32: fp32 there" : "");
  } else if (cfg.precision != "fp32") {
    out << "\nddp_train: precision " << cfg.precision
        << ": convolutions and linear layers take their inputs, weights and output gradients in "
        << cfg.precision << " and accumulate in fp32 (autocast); master weights, optimizer, BatchNorm and loss fp32";
    if (const optim::GradScaler* s = replica.scaler())
      out << "; loss scale " << s->scale() << ", halved on a step with non-finite gradients (skipped), doubled after "
          << s->options().growth_interval << " good steps";
    if (ranks[0].device == std::string("cpu"))
      out << "; on CPUs the values are rounded to " << cfg.precision
          << " and computed in fp32: a GPU's numerics, not its speed";
    else
      out << "; on GPUs cuDNN's and cuBLAS's " << cfg.precision << " kernels (tensor cores)";
  }
  if (cfg.deterministic_shards > 0)
    out << "\nddp_train: deterministic: " << cfg.deterministic_shards << " micro-shards of "
        << cfg.batch_size / cfg.deterministic_shards
        << " samples per step, each on "
        << (ranks[0].device == std::string("cpu") ? "one thread" : "the GPU in turn, deterministic cuDNN algorithms")
        << ", gradients summed as integers; bitwise the same at world sizes "
        << reproducing_world_sizes(cfg.deterministic_shards)
        << (nn::has_batch_norm(graph) ? "; BatchNorm's statistics over the global batch, each micro-shard's summed in "
                                    "shard order"
                                  : "");
  if (cfg.accumulate > 1)
    out << "; " << cfg.accumulate << " micro-batches of " << cfg.batch_size / world.size / cfg.accumulate
        << " per rank per step (--accumulate), all-reduce after the last";
  out << "\n";
  out << " rank  host                 local  device  threads  shard  steps\n";
  for (int r = 0; r < world.size; ++r) {
    std::snprintf(line, sizeof(line), " %4d  %-20s %2d/%-3d %-7s %7d  %5lld  %5lld\n", r, ranks[r].host,
                  ranks[r].local_rank, ranks[r].local_size, ranks[r].device, ranks[r].threads,
                  static_cast<long long>(ranks[r].shard), static_cast<long long>(ranks[r].steps));
    out << line;
  }
  describe_blas(ranks, out);
  out.flush();
}

// The GPUs of the start-up table: one line per rank that has a description.
void describe_devices(Replica& replica, const World& world, std::ostream& out) {
  char mine[256] = {};
  std::snprintf(mine, sizeof mine, "%s", replica.device_description().c_str());
  const std::vector<char> all = replica.comm().allgather(mine, sizeof mine, "start-up device descriptions");
  if (world.rank != 0) return;
  for (int r = 0; r < world.size; ++r) {
    const char* d = all.data() + size_t(r) * sizeof mine;
    if (d[0]) out << " rank " << r << ": " << std::string(d, strnlen(d, sizeof mine)) << "\n";
  }
  out.flush();
}

}  // namespace

void startup_table(Replica& replica, const World& world, const Config& cfg, const optim::LrSchedule& schedule,
                   int64_t shard, int64_t steps, std::ostream& out) {
  startup_check(replica, world, cfg, schedule, shard, steps, out);
  describe_devices(replica, world, out);
}

}  // namespace ddp::train
