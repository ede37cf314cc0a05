// One checking macro per GPU library, each naming the failing call and where
// it is; the message becomes "ddp_train: error: <it> (rank R)" at main.
// Every CUDA, cuDNN, cuBLAS and NCCL call in ddp goes through one of these.
#pragma once

#include <cublas_v2.h>        // cublasStatus_t
#include <cuda_runtime_api.h> // cudaError_t, cudaGetErrorName/String
#include <cudnn.h>            // cudnnStatus_t, cudnnGetErrorString
#include <nccl.h>             // ncclResult_t, ncclGetErrorString

#include "ddp/core/error.hpp"  // ddp::Error, DDP_FAIL

namespace ddp::cuda {

const char* cublas_status_name(cublasStatus_t s);

}  // namespace ddp::cuda

#define DDP_GPU_FAIL_(call, what) DDP_FAIL(call, " failed: ", what, " at ", __FILE__, ":", __LINE__)

#define DDP_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t ddp_err_ = (call);                                                      \
    if (ddp_err_ != cudaSuccess)                                                              \
      DDP_GPU_FAIL_(#call, ::ddp::detail::concat(cudaGetErrorString(ddp_err_), " (",          \
                                                 cudaGetErrorName(ddp_err_), ")"));           \
  } while (0)

#define DDP_CUDNN_CHECK(call)                                                                 \
  do {                                                                                        \
    const cudnnStatus_t ddp_err_ = (call);                                                    \
    if (ddp_err_ != CUDNN_STATUS_SUCCESS) DDP_GPU_FAIL_(#call, cudnnGetErrorString(ddp_err_)); \
  } while (0)

#define DDP_CUBLAS_CHECK(call)                                                                \
  do {                                                                                        \
    const cublasStatus_t ddp_err_ = (call);                                                   \
    if (ddp_err_ != CUBLAS_STATUS_SUCCESS)                                                    \
      DDP_GPU_FAIL_(#call, ::ddp::cuda::cublas_status_name(ddp_err_));                        \
  } while (0)

// ncclInProgress is not a failure: a non-blocking communicator (the only kind
// ddp makes) returns it while an operation is being set up.
#define DDP_NCCL_CHECK(call)                                                                  \
  do {                                                                                        \
    const ncclResult_t ddp_err_ = (call);                                                     \
    if (ddp_err_ != ncclSuccess && ddp_err_ != ncclInProgress)                                \
      DDP_GPU_FAIL_(#call, ::ddp::detail::concat(ncclGetErrorString(ddp_err_), " (NCCL ",     \
                                                 static_cast<int>(ddp_err_), ")"));           \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration), not the
// kernel's outcome (that surfaces at the next synchronising call).
#define DDP_CUDA_CHECK_LAUNCH(kernel) DDP_CUDA_CHECK((static_cast<void>(#kernel), cudaGetLastError()))
