// block_sum: a fixed-order sum of one double per thread over a block of
// kThreads threads (a power of two), in shared memory s of kThreads
// entries. Every thread calls it; the sum is in s[0] when it returns. The
// order depends on kThreads alone, so the same values give the same bits.
#pragma once

namespace ddp::cuda {

template <int kThreads>
__device__ double block_sum(double* s, double v) {
  static_assert((kThreads & (kThreads - 1)) == 0, "block_sum halves the block: kThreads must be a power of two");
  s[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    __syncthreads();
  }
  return s[0];
}

}  // namespace ddp::cuda
