#include "ddp/train/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <ostream>
#include <vector>

#include "ddp/checkpoint/safetensors.hpp"   // write_safetensors: --output-model
#include "ddp/comm/checked_communicator.hpp"  // --debug-collectives
#include "ddp/comm/communicator.hpp"        // Communicator: MPI backend
#include "ddp/comm/watchdog.hpp"            // Watchdog: numbered collectives, the stall report
#include "ddp/core/error.hpp"               // DDP_CHECK, CollectiveError
#include "ddp/core/finite.hpp"              // first_non_finite: no diverged state is saved
#include "ddp/core/trace.hpp"               // Trace: --trace's timeline
#include "ddp/data/dataset.hpp"             // load_idx_dir, make_synthetic
#include "ddp/data/loader.hpp"              // Loader: prefetching batches
#include "ddp/data/sampler.hpp"             // DistributedSampler, eval_shard
#include "ddp/ddp/reducer.hpp"              // broadcast_from_rank0
#include "ddp/nn/graph.hpp"                 // model_graph: the model, described once
#include "ddp/nn/model.hpp"                 // init_state
#include "ddp/runtime/stop_signal.hpp"       // SIGTERM/SIGINT -> stop at a step boundary
#include "ddp/train/optim_config.hpp"       // flags -> optimizer options, LR schedule
#include "ddp/train/preflight.hpp"          // preflight: reachability, duplicate hostnames
#include "ddp/train/checkpointing.hpp"      // Checkpointing: the state saved and restored
#include "ddp/train/placement.hpp"          // --device/--backend -> this rank's device
#include "ddp/train/reporter.hpp"           // Reporter: rank 0's lines and files, the epoch's record
#include "ddp/train/replica.hpp"            // Replica: the model on its device, the step
#include "ddp/train/resume.hpp"             // checkpoint contents, resume point
#include "ddp/train/run_paths.hpp"          // check_run_paths: paths and the checkpoint directory's lock
#include "ddp/train/step_stats.hpp"         // StepStats: the median step and its parts
#include "ddp/train/usage.hpp"              // RankUsage: every rank's peak memory

namespace ddp::train {

namespace {

// --precision fp16: a loss scale below this (40 halvings of the default
// 65536 in a row) ends the run as diverged.
constexpr float kMinLossScale = 0x1p-24f;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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
                graph.num_params, reducer.buckets().size(), reducer.buckets().size() == 1 ? "" : "s",
                cfg.batch_size, cfg.batch_size / world.size, static_cast<long long>(steps));
  out << line;
  out << "ddp_train: optimizer " << optim::describe(replica.optimizer().options()) << "; lr " << schedule.describe();
  if (cfg.scale_lr)
    out << " (--scale-lr: " << cfg.lr << " x global batch " << cfg.batch_size << " / 256)";
  if (cfg.grad_compression != "none") out << "; gradients all-reduced as " << cfg.grad_compression;
  if (cfg.precision != "fp32") {
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

data::Split read_data(const Config& cfg) {
  if (!cfg.data_dir.empty()) {
    try {
      return data::load_idx_dir(cfg.data_dir);
    } catch (const std::bad_alloc&) {
      DDP_FAIL("--data-dir ", cfg.data_dir, ": not enough memory for the images its headers declare");
    }
  }
  const int64_t n = cfg.synthetic > 0 ? cfg.synthetic : kDefaultSynthetic;
  try {
    return data::make_synthetic(n, cfg.seed);
  } catch (const std::bad_alloc&) {
    DDP_FAIL("--synthetic ", n, ": not enough memory for ", n, " images of 28x28 (", (n * 28 * 28 * 4) >> 20,
             " MiB, and a fifth of that again for the test set)");
  }
}

// The dataset, with --train-limit applied: the sampler then works on those
// samples alone, as on a dataset of that size.
data::Split load_data(const Config& cfg) {
  data::Split s = read_data(cfg);
  if (cfg.train_limit > 0) {
    data::Dataset& t = s.train;
    DDP_CHECK(cfg.train_limit <= t.n, "--train-limit ", cfg.train_limit, " is more than the ", t.n,
              " training images of ", t.source);
    t.n = cfg.train_limit;
    t.images.resize(size_t(t.n * t.sample_numel()));
    t.labels.resize(size_t(t.n));
    t.source += detail::concat(", its first ", t.n);
  }
  return s;
}

// Runs fn on every rank. When it throws on some, every rank throws one
// CollectiveError (said once, by rank 0) with the first failing rank's
// message, saying which ranks failed unless all did with that very message:
// a file every rank reads fails once, not once per rank.
template <typename Fn>
void on_every_rank(comm::Communicator& comm, const char* what, Fn&& fn) {
  constexpr size_t kMessage = 1024;
  std::array<char, kMessage> mine{};
  try {
    fn();
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    std::snprintf(mine.data(), kMessage, "%s", e.what()[0] ? e.what() : "unknown error");
  }
  const std::vector<char> all = comm.allgather(mine.data(), kMessage, what);
  auto message = [&](int r) { return std::string(all.data() + size_t(r) * kMessage); };
  int first = -1, failed = 0, same = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (message(r).empty()) continue;
    if (first < 0) first = r;
    ++failed;
    same += message(r) == message(first);
  }
  if (failed == 0) return;
  if (same == comm.size()) throw CollectiveError(message(first));
  throw CollectiveError(detail::concat(message(first), " (on rank ", first,
                                       failed > 1 ? detail::concat("; ", failed, " ranks failed") : "", ")"));
}

// Exact distributed accuracy: each rank counts its eval_shard, counts are summed.
double evaluate(Replica& replica, const World& world, const data::Dataset& test, int batch) {
  data::Loader loader(test, data::eval_shard(test.n, world.size, world.rank), batch,
                      /*drop_last=*/false);
  data::Batch b;
  while (loader.next(b)) replica.eval_batch(b);
  const Sums s = replica.take_sums();  // the training steps' were taken at the epoch's end
  double counts[2] = {s.eval_correct, s.eval_samples};
  replica.comm().allreduce_doubles(counts, 2, /*max=*/false, "evaluation counts");
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}

// A step whose averaged gradients are not finite: every rank has the same
// gradients, so all of them are here; they say which had a non-finite loss
// (where the host has it: not on GPUs), and the job ends naming the step,
// before anything of it is saved.
[[noreturn]] void diverged(comm::Communicator& comm, const StepHealth& health, int64_t epoch, int64_t step,
                           int64_t global_step) {
  const double mine[2] = {health.loss, health.loss_known ? 1.0 : 0.0};
  const std::vector<char> all = comm.allgather(mine, sizeof mine, "divergence: every rank's loss");
  std::string ranks;
  int bad = 0, known = 0;
  for (int r = 0; r < comm.size(); ++r) {
    double theirs[2];
    std::memcpy(theirs, all.data() + r * sizeof mine, sizeof mine);
    if (theirs[1] == 0) continue;
    ++known;
    if (!std::isfinite(theirs[0])) ranks += detail::concat(bad++ ? ", " : "", r);
  }
  std::string what = "the averaged gradients hold a NaN or an infinity";
  if (known == comm.size())
    what += bad == 0             ? ", and the loss was finite on every rank"
            : bad == comm.size() ? ", and the loss was NaN or infinite on every rank"
                                 : detail::concat(", and the loss was NaN or infinite on rank", bad > 1 ? "s " : " ",
                                                  ranks);
  throw CollectiveError(detail::concat("training diverged at epoch ", epoch + 1, ", step ", step, " (global step ",
                                       global_step, "): ", what,
                                       ". Nothing of this step was saved; a smaller --lr may help"));
}

}  // namespace

int run(const World& world, const Config& cfg, std::ostream& out) {
  const bool leader = world.rank == 0;
  // Before anything is read or trained; the checkpoint directory stays
  // locked for this job until run returns.
  std::unique_ptr<checkpoint::DirLock> dir_lock;
  if (leader) dir_lock = check_run_paths(cfg, world.host, std::cerr);
  if (dir_lock && !dir_lock->unguarded().empty()) std::cerr << "ddp_train: warning: " << dir_lock->unguarded() << "\n";
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_sec * 1000));
  std::unique_ptr<comm::Communicator> host_comm = comm::make_mpi_communicator(world);
  if (cfg.debug_collectives) host_comm = comm::make_checked_communicator(std::move(host_comm));
  host_comm->set_timeout(timeout);
  preflight(*host_comm, world, std::chrono::milliseconds(static_cast<int64_t>(cfg.preflight_timeout_sec * 1000)),
            std::cerr);

  const int per_rank = cfg.batch_size / world.size;
  data::Split data;
  on_every_rank(*host_comm, "dataset check", [&] {
    data = load_data(cfg);
    DDP_CHECK(data.train.n / world.size >= per_rank, "dataset too small: ", data.train.n, " training images (",
              data.train.source, ") do not fill one global batch of ", cfg.batch_size, " (--batch-size)");
  });
  const data::Dataset& train = data.train;
  data::DistributedSampler sampler(train.n, world.size, world.rank, cfg.seed);
  // Micro-shards are contiguous blocks of the global batch (Note [fixed-point
  // gradients], ddp/exact_sum.hpp).
  if (cfg.deterministic_shards > 0) sampler.set_contiguous(cfg.batch_size);
  const int64_t steps = sampler.num_samples() / per_rank;

  // The model, described once, and this rank's replica of it on its device.
  nn::Graph graph = nn::model_graph(cfg.model, {train.c, train.h, train.w}, train.classes);
  const optim::Options optimizer = optimizer_options(cfg);
  const optim::LrSchedule schedule = lr_schedule(cfg, int64_t(cfg.epochs) * steps);

  const Placement place = place_rank(*host_comm, world, cfg);
  if (leader && !place.note.empty()) std::cerr << "ddp_train: note: " << place.note << "\n";
  // The flags' validation refuses --device cuda; --device auto shows here
  // whether it found GPUs.
  if (cfg.debug_collectives && place.device == "cuda") throw UsageError(kDebugCollectivesOnGpus);
  // From here on every collective is numbered, and a stalled one ends the
  // job with rank 0's report of who is missing (comm/watchdog.hpp).
  std::unique_ptr<comm::Watchdog> watchdog;
  if (world.size > 1) watchdog = std::make_unique<comm::Watchdog>(world, comm::Watchdog::Options{timeout});
  std::unique_ptr<Backend> backend;
  if (place.device == "cuda") {
#if DDP_HAVE_CUDA
    backend = make_cuda_backend(world, cfg, place.gpu, std::move(host_comm), watchdog.get());
#endif
  } else {
    // --deterministic runs each micro-shard on one of the threads (Note
    // [lanes] in nn/device.hpp), so every thread is used at any world size.
    backend = make_cpu_backend(watchdog ? watchdog->watch(std::move(host_comm)) : std::move(host_comm));
  }
  DDP_CHECK(backend, "--device ", place.device, ": not in this build");
  auto replica = std::make_unique<Replica>(cfg, optimizer, std::move(backend), std::move(graph));
  // Ends the watching before the replica goes: with every rank at the end
  // of training (each return below follows a barrier), or at once when an
  // error leaves.
  struct EndWatch {
    std::unique_ptr<comm::Watchdog>& w;
    ~EndWatch() {
      if (w && std::uncaught_exceptions() == 0) w->stop();
      w.reset();
    }
  } end_watch{watchdog};
  comm::Communicator& comm = replica->comm();
  comm.set_timeout(timeout);

  // Where to start: a checkpoint's position, or the beginning.
  const bool checkpointing = !cfg.checkpoint_dir.empty();
  Checkpointing saved(world, cfg, *replica);
  checkpoint::RunState state = saved.start(train, schedule, optimizer, steps, out);
  if (checkpointing) install_stop_handlers();

  startup_check(*replica, world, cfg, schedule, sampler.num_samples(), steps, out);
  describe_devices(*replica, world, out);

  // --trace: every rank's clock starts at one moment, so their files line up.
  std::unique_ptr<Trace> trace;
  if (!cfg.trace.empty()) {
    comm.barrier("--trace: a common start of the ranks' clocks");
    trace = std::make_unique<Trace>(world.rank, world.host, cfg.trace_first, cfg.trace_last, Trace::Clock::now());
    replica->set_trace(trace.get());
  }
  const auto write_trace = [&]() {
    if (trace && !trace->written()) trace->write(trace_path_for_rank(cfg.trace, world.rank));
  };

  Reporter report(world, cfg, steps, /*append_metrics=*/state.global_step > 0, out);

  // Every rank must see the same answer at the same step (ranks get signals
  // at different moments), so the flag is all-reduced at each boundary.
  auto stop_requested = [&]() {
    double sig = stop_signal();
    comm.allreduce_doubles(&sig, 1, /*max=*/true, "stop-signal agreement");
    return static_cast<int>(sig);
  };

  StepStats run_steps;  // every step of this run, for the summary
  RunSummary summary;
  data::Batch batch;
  const int64_t first_epoch = state.epoch;

  for (int64_t epoch = first_epoch; epoch < cfg.epochs; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    const int64_t first_step = epoch == first_epoch ? state.step_in_epoch : 0;
    data::Loader loader(train, sampler.indices(), per_rank, /*drop_last=*/true, first_step);
    // Sums of the epoch so far: this rank's part of them. A resumed epoch
    // starts from the checkpoint's totals, counted once (by rank 0).
    Sums sums;
    double resumed_sec = 0;
    if (first_step > 0 && leader) {
      sums.loss = state.epoch_loss_sum;
      sums.correct = state.epoch_correct;
      sums.samples = state.epoch_samples;
    }
    if (first_step > 0) resumed_sec = state.epoch_train_sec;
    const auto t0 = Clock::now();
    int64_t step = first_step;
    report.start_epoch(epoch, first_step);
    Sums this_run;  // this rank's, this run: the progress line's
    auto add_steps = [&sums, &replica, &this_run]() {
      const Sums s = replica->take_sums();
      sums += s;
      this_run += s;
      return s;
    };
    StepStats epoch_times;
    int64_t skipped_steps = 0;  // by fp16's loss scaler, this epoch
    for (;;) {
      if (trace) {
        if (trace->window_passed(state.global_step + 1)) write_trace();  // not part of any step's time
        trace->begin_step(state.global_step + 1);
      }
      const auto step_start = Clock::now();
      bool more;
      {
        TraceScope span(trace.get(), Trace::kStep, "data", "data wait");
        more = loader.next(batch);
      }
      if (!more) break;
      const double data_wait = seconds_since(step_start);
      const StepHealth health = replica->train_step(batch, schedule.at(state.global_step));
      if (trace)
        trace->span(Trace::kStep, "step", detail::concat("step ", state.global_step + 1), step_start, Clock::now(),
                    {{"step", state.global_step + 1}, {"epoch", epoch + 1}});
      epoch_times.add(data_wait, replica->step_times());
      run_steps.add(data_wait, replica->step_times());
      if (health.skipped) {
        // fp16's scaler skipped the step (every rank alike) and halved its
        // scale; a scale this small means the gradients are not finite at
        // any scale.
        ++skipped_steps;
        if (replica->scaler()->scale() < kMinLossScale)
          throw CollectiveError(detail::concat(
              "training diverged at epoch ", epoch + 1, ", step ", step + 1, " (global step ", state.global_step + 1,
              "): --precision fp16's loss scale fell to ", replica->scaler()->scale(),
              ", every step skipped for non-finite gradients; nothing of it was saved. A smaller --lr, or "
              "--precision bf16, may help"));
      } else if (!health.grads_finite) {
        diverged(comm, health, epoch, step + 1, state.global_step + 1);
      }
      ++step;
      ++state.global_step;
      state.samples_consumed += cfg.batch_size;
      // Rank 0's own batch: its loss and accuracy need its sums now (on a
      // GPU that waits for rank 0's device, each step).
      if (report.wants_step_scalars())
        report.step_scalars(state.global_step, add_steps(), schedule.at(state.global_step - 1), data_wait,
                            replica->step_times());
      if (report.progress_due(step)) {
        add_steps();  // rank 0's alone: on a GPU this waits for its device, no other rank
        report.show_progress(step, this_run.loss / this_run.samples);
      }
      if (!checkpointing || step == steps) continue;  // the epoch's end saves below
      const int sig = stop_requested();
      const bool due = cfg.checkpoint_every > 0 && state.global_step % cfg.checkpoint_every == 0;
      if (!sig && !due) continue;
      // Mid-epoch checkpoint: the epoch's sums so far, over all ranks.
      add_steps();
      double part[3] = {sums.loss, sums.correct, sums.samples};
      comm.allreduce_doubles(part, 3, /*max=*/false, "checkpoint epoch sums");
      checkpoint::RunState s = state;
      s.epoch = epoch;
      s.step_in_epoch = step;
      s.world_size = world.size;
      s.epoch_loss_sum = part[0];
      s.epoch_correct = part[1];
      s.epoch_samples = part[2];
      s.epoch_train_sec = resumed_sec + seconds_since(t0);
      const std::string path = saved.save(s, trace.get());
      if (sig) {
        write_trace();
        report.stopped(sig, detail::concat(" at epoch ", epoch + 1, ", step ", step, "; checkpoint ", path),
                       /*clear_line=*/true);
        comm.barrier("stop after checkpoint");
        return kExitStoppedBySignal;
      }
    }
    add_steps();  // waits for the device: the epoch's time includes all its work
    double train_sec = seconds_since(t0);
    comm.allreduce_doubles(&train_sec, 1, /*max=*/true, "epoch time");
    double totals[4] = {sums.loss, sums.correct, sums.samples, sums.comm_wait};
    comm.allreduce_doubles(totals, 4, /*max=*/false, "training metrics");
    train_sec += resumed_sec;
    // Where steps are not checked one by one (GPUs: replica.hpp), the epoch's
    // loss is, before its checkpoint; the totals are the same on every rank.
    if (!std::isfinite(totals[0]))
      throw CollectiveError(detail::concat("training diverged in epoch ", epoch + 1, ": its loss sums to ",
                                           totals[0], "; a smaller --lr may help"));

    EpochRecord r;
    r.breakdown = epoch_times.reduce(comm, "step times");
    r.usage = gather_usage(comm, {rss_peak_mib(), replica->device_usage()});
    const auto t1 = Clock::now();
    {
      TraceScope span(trace.get(), Trace::kStep, "evaluation", "evaluation", {{"epoch", epoch + 1}});
      saved.sync_buffers();
      r.test_acc = evaluate(*replica, world, data.test, per_rank);
    }
    r.eval_sec = seconds_since(t1);

    r.epoch = epoch + 1;
    r.epochs = cfg.epochs;
    r.global_step = state.global_step;
    r.train_loss = totals[0] / totals[2];
    r.train_acc = totals[1] / totals[2];
    r.epoch_sec = train_sec;
    r.samples_per_sec = totals[2] / train_sec;
    r.comm_wait_sec = totals[3] / world.size;
    r.lr = schedule.at(state.global_step - 1);  // the epoch's last step's
    // This rank's own counts: the same on every rank.
    const int64_t epoch_steps = std::max<int64_t>(1, steps - first_step);
    r.allreduces_per_step = sums.allreduces / double(epoch_steps);
    r.allreduce_bytes_per_step = sums.allreduce_bytes / double(epoch_steps);
    // Over the steps that took one: a step fp16's scaler skipped has none.
    if (cfg.clip_grad_norm > 0)
      r.grad_norm = sums.grad_norm / double(std::max<int64_t>(1, epoch_steps - skipped_steps));
    if (const optim::GradScaler* s = replica->scaler()) {
      r.loss_scale = double(s->scale());
      r.skipped_steps = skipped_steps;
    }
    report.epoch(r);
    summary.epochs.push_back(std::move(r));
    if (checkpointing) {
      checkpoint::RunState s = state;
      s.epoch = epoch + 1;
      s.step_in_epoch = 0;
      s.world_size = world.size;
      s.epoch_loss_sum = s.epoch_correct = s.epoch_samples = s.epoch_train_sec = 0;
      saved.save(s, trace.get());
      if (const int sig = stop_requested(); sig && epoch + 1 < cfg.epochs) {
        write_trace();
        report.stopped(sig, detail::concat(" after epoch ", epoch + 1), /*clear_line=*/false);
        comm.barrier("stop after checkpoint");
        return kExitStoppedBySignal;
      }
    }
  }
  // A run resumed after its last epoch still reports where it stands.
  if (summary.epochs.empty()) {
    saved.sync_buffers();
    summary.test_acc = evaluate(*replica, world, data.test, per_rank);
  } else {
    summary.test_acc = summary.epochs.back().test_acc;
  }

  write_trace();
  summary.steps = run_steps.reduce(comm, "the run's step times");
  if (leader && !cfg.output_model.empty()) saved.write_model(cfg.output_model, cfg.epochs);
  summary.backend = comm.backend();
  summary.device = place.device;
  summary.steps_per_epoch = steps;
  summary.global_step = state.global_step;
  report.summary(summary);
  // Nobody leaves before rank 0 has written its files: a rank that exits
  // early would not hurt, but a job that reports success before the model is
  // on disk would.
  comm.barrier("end of training");
  return 0;
}

}  // namespace ddp::train
