#include "ddp/runtime/world.hpp"

#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "ddp/runtime/mpi_check.hpp"

namespace ddp {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, len);
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void set_blas_threads(int n) { openblas_set_num_threads(std::max(1, n)); }

World init_world(int* argc, char*** argv) {
  World w = init_mpi(argc, argv);
  init_node(w);
  return w;
}

World init_mpi(int* argc, char*** argv) {
  World w;
  int initialized = 0;
  DDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    DDP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    w.owns_mpi = true;
    // Errors come back as codes so that DDP_MPI_CHECK can name the call.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    DDP_CHECK(provided == MPI_THREAD_MULTIPLE,
              "MPI gives thread level ", provided, ", ddp needs MPI_THREAD_MULTIPLE (",
              MPI_THREAD_MULTIPLE, ") for its communication thread");
  }
  w.comm = MPI_COMM_WORLD;
  DDP_MPI_CHECK(MPI_Comm_rank(w.comm, &w.rank));
  DDP_MPI_CHECK(MPI_Comm_size(w.comm, &w.size));
  return w;
}

void init_node(World& w) {
  DDP_MPI_CHECK(MPI_Comm_split_type(w.comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL,
                                    &w.local_comm));
  DDP_MPI_CHECK(MPI_Comm_rank(w.local_comm, &w.local_rank));
  DDP_MPI_CHECK(MPI_Comm_size(w.local_comm, &w.local_size));
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  DDP_MPI_CHECK(MPI_Get_processor_name(host, &len));
  w.host.assign(host, len);
  // Cores are counted on the node, not per process: a rank bound to one core
  // by mpirun still sees the node's ranks sharing what it sees.
  w.threads = std::max(1, available_cores() / w.local_size);
  set_blas_threads(w.threads);
}

void finalize_world(World& w) {
  if (w.local_comm != MPI_COMM_NULL) MPI_Comm_free(&w.local_comm);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (w.owns_mpi && !finalized) MPI_Finalize();
  w.owns_mpi = false;
}

void abort_world(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // A world of one has nobody to stop; finalising spares the user
    // MPI_Abort's banner under a plain launch.
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    MPI_Finalize();
  }
  std::_Exit(code);
}

}  // namespace ddp
