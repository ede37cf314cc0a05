// A run's set-up (setup.hpp).
#include "ddp/train/setup.hpp"

#include <array>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "ddp/comm/checked_communicator.hpp"  // --debug-collectives
#include "ddp/core/error.hpp"                 // DDP_CHECK, CollectiveError, UsageError
#include "ddp/train/preflight.hpp"            // preflight: reachability, duplicate hostnames
#include "ddp/train/run_paths.hpp"            // check_run_paths: paths and the checkpoint directory's lock

namespace ddp::train {

namespace {

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

// The dataset, with --train-limit applied.
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

}  // namespace

std::unique_ptr<checkpoint::DirLock> lock_run_paths(const World& world, const Config& cfg) {
  if (world.rank != 0) return nullptr;
  std::unique_ptr<checkpoint::DirLock> lock = check_run_paths(cfg, world.host, std::cerr);
  if (lock && !lock->unguarded().empty()) std::cerr << "ddp_train: warning: " << lock->unguarded() << "\n";
  return lock;
}

std::chrono::milliseconds collective_timeout(const Config& cfg) {
  return std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_sec * 1000));
}

std::unique_ptr<comm::Communicator> open_host_comm(const World& world, const Config& cfg) {
  std::unique_ptr<comm::Communicator> comm = comm::make_mpi_communicator(world);
  if (cfg.debug_collectives) comm = comm::make_checked_communicator(std::move(comm));
  comm->set_timeout(collective_timeout(cfg));
  preflight(*comm, world, std::chrono::milliseconds(static_cast<int64_t>(cfg.preflight_timeout_sec * 1000)),
            std::cerr);
  return comm;
}

TrainingData load_training_data(comm::Communicator& comm, const World& world, const Config& cfg) {
  const int per_rank = cfg.batch_size / world.size;
  data::Split split;
  on_every_rank(comm, "dataset check", [&] {
    split = load_data(cfg);
    DDP_CHECK(split.train.n / world.size >= per_rank, "dataset too small: ", split.train.n, " training images (",
              split.train.source, ") do not fill one global batch of ", cfg.batch_size, " (--batch-size)");
  });
  data::DistributedSampler sampler(split.train.n, world.size, world.rank, cfg.seed);
  // Micro-shards are contiguous blocks of the global batch (Note [fixed-point
  // gradients], ddp/exact_sum.hpp).
  if (cfg.deterministic_shards > 0) sampler.set_contiguous(cfg.batch_size);
  const int64_t steps = sampler.num_samples() / per_rank;
  return {std::move(split), sampler, per_rank, steps};
}

Placement place(comm::Communicator& host_comm, const World& world, const Config& cfg) {
  Placement p = place_rank(host_comm, world, cfg);
  if (world.rank == 0 && !p.note.empty()) std::cerr << "ddp_train: note: " << p.note << "\n";
  // The flags' validation refuses --device cuda; --device auto shows here
  // whether it found GPUs.
  if (cfg.debug_collectives && p.device == "cuda") throw UsageError(kDebugCollectivesOnGpus);
  return p;
}

std::unique_ptr<Replica> make_replica(const World& world, const Config& cfg, const Placement& place,
                                      std::unique_ptr<comm::Communicator> host_comm, comm::Watchdog* watchdog,
                                      nn::Graph graph, const optim::Options& optimizer) {
  std::unique_ptr<Backend> backend;
  if (place.device == "cuda") {
#if DDP_HAVE_CUDA
    backend = make_cuda_backend(world, cfg, place.gpu, std::move(host_comm), watchdog);
#endif
  } else {
    // --deterministic runs each micro-shard on one of the threads (Note
    // [lanes] in nn/device.hpp), so every thread is used at any world size.
    backend = make_cpu_backend(watchdog ? watchdog->watch(std::move(host_comm)) : std::move(host_comm));
  }
  DDP_CHECK(backend, "--device ", place.device, ": not in this build");
  return std::make_unique<Replica>(cfg, optimizer, std::move(backend), std::move(graph));
}

}  // namespace ddp::train
