// DDP_MPI_CHECK(call): one checking macro for MPI; the error names the call,
// the MPI error string and the source location.
#pragma once

#include <mpi.h>

#include <string>

#include "ddp/core/error.hpp"

namespace ddp {
std::string mpi_error_string(int code);
}

#define DDP_MPI_CHECK(call)                                                       \
  do {                                                                            \
    int ddp_mpi_rc_ = (call);                                                     \
    if (ddp_mpi_rc_ != MPI_SUCCESS)                                               \
      DDP_FAIL(#call, " failed: ", ::ddp::mpi_error_string(ddp_mpi_rc_), " at ", \
               __FILE__, ":", __LINE__);                                          \
  } while (0)
