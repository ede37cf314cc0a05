// ddp_train: one process per rank. Turns every failure into the contract
// "ddp_train: error: <what> (rank R)" on stderr and a non-zero exit of the
// whole job (MPI_Abort), never a hang.
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <thread>

#include "ddp/cli/options.hpp"       // parse_options: flags -> Config
#include "ddp/core/error.hpp"        // Error, CollectiveError (UsageError)
#include "ddp/runtime/blas_kernels.hpp"  // ensure_blas_kernels: the kernels this CPU runs
#include "ddp/runtime/world.hpp"     // init_world, abort_world
#include "ddp/train/trainer.hpp"     // run: the epoch loop

namespace {

// Errors every rank raises alike are said once, by rank 0; the others wait
// for rank 0's MPI_Abort to end them, and should it not come within wait_s
// (rank 0 died first, and the launcher leaves the job to its other ranks,
// as srun without --kill-on-bad-exit does), say it and end the job
// themselves.
[[noreturn]] void fail(const ddp::World& world, const char* what, bool same_on_every_rank, double wait_s) {
  auto say = [&] {
    std::fprintf(stderr, "ddp_train: error: %s (rank %d)\n", what, world.rank);
    std::fflush(stderr);
  };
  if (!same_on_every_rank || world.rank == 0) {
    say();
    ddp::abort_world(1);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
  say();
  ddp::abort_world(1);
}

}  // namespace

int main(int argc, char** argv) {
  // Before MPI: it may execute this program again (Note [BLAS kernels]).
  const std::string blas = ddp::ensure_blas_kernels(argv);
  ddp::World world;
  try {
    world = ddp::init_mpi(&argc, &argv);
    world.blas = blas;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train: error: %s (rank ?)\n", e.what());
    ddp::abort_world(1);
  }
  double wait_s = 60;  // fail's wait for rank 0's abort: --timeout once parsed
  try {
    const auto parsed = ddp::cli::parse_options(argc, argv, world.size);
    wait_s = parsed.config.timeout_sec;
    if (parsed.help) {
      if (world.rank == 0) std::cout << *parsed.help;
      ddp::finalize_world(world);
      return 0;
    }
    // Before anything else talks between nodes (init_node's MPI_Comm_split_type
    // would block there for good if a peer is unreachable).
    ddp::check_reachable(world, std::chrono::milliseconds(
                                    static_cast<int64_t>(parsed.config.preflight_timeout_sec * 1000)));
    ddp::init_node(world);
    const int rc = ddp::train::run(world, parsed.config, std::cout);
    ddp::finalize_world(world);
    return rc;
  } catch (const ddp::CollectiveError& e) {
    fail(world, e.what(), true, wait_s);
  } catch (const std::exception& e) {
    fail(world, e.what(), false, wait_s);
  }
}

