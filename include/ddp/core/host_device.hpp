// DDP_HOST_DEVICE marks a function that the CUDA kernels call on the device
// and the host calls too: __host__ __device__ under nvcc, nothing for a
// host compiler. Such functions hold the kernels' arithmetic
// (nn/kernel_math.hpp, optim/update_math.hpp), so the unit tests can check it
// against the CPU layers on a machine without a GPU.
#pragma once

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif
