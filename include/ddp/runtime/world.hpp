// ddp::World: all multi-process state in one plain struct. Rank and size come
// from MPI (mpirun, srun with PMIx, or a plain process as a world of one);
// the local rank from the ranks that share this node's memory.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>

namespace ddp {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;   // rank among the processes on this node
  int local_size = 1;   // processes on this node
  int threads = 1;      // CPU threads this rank may use: cores / local_size, at least 1
  std::string host;     // this node's hostname
  std::string blas;     // the BLAS kernels this rank runs (ensure_blas_kernels), for the start-up table
  MPI_Comm comm = MPI_COMM_WORLD;
  MPI_Comm local_comm = MPI_COMM_NULL;
  bool owns_mpi = false;  // true when this World called MPI_Init_thread
};

// Initialise MPI with MPI_THREAD_MULTIPLE (the communication thread needs it),
// find the local rank and the thread budget, and apply the budget to OpenBLAS.
// Throws ddp::Error when MPI cannot give MPI_THREAD_MULTIPLE.
World init_world(int* argc, char*** argv);

// init_world's two steps, for a caller that must act between them (ddp_train
// reads its flags, then checks that every rank is reachable): init_mpi talks
// to no other rank; init_node does (MPI_Comm_split_type is a collective over
// w.comm, the job's first message between nodes unless check_reachable ran).
World init_mpi(int* argc, char*** argv);
void init_node(World& w);

// The job's first message between ranks, bounded: a one-int all-reduce over
// w.comm that must complete within timeout, else ddp::Error naming the
// likely causes. It must come before any blocking collective (init_node):
// a rank blocked inside MPI cannot give up, so an unreachable peer would hang
// the job there instead of ending it.
void check_reachable(const World& w, std::chrono::milliseconds timeout);

// What to check when ranks cannot reach each other: one line, for errors.
const char* unreachable_hints();

// Finalise MPI if init_world initialised it.
void finalize_world(World& world);

// End every rank of the job now: print nothing more, MPI_Abort with code.
[[noreturn]] void abort_world(int code);

// Threads available to this process (sched_getaffinity), at least 1.
int available_cores();

// Set the threads OpenBLAS uses for GEMM.
void set_blas_threads(int n);

}  // namespace ddp
