// Softmax cross-entropy and accuracy on the GPU (cuda_device.hpp), the twins
// of nn/cpu/loss.cpp and count_correct in model.cpp: one thread a row
// (kernel_math.hpp's argmax_row and softmax_xent_row), then one block-wide
// sum so each block adds its loss and correct count to the device totals
// with one atomicAdd each (a launch may take a batch's micro-shards, each
// summed as a launch of its own would). The totals stay on the device: an
// epoch's metrics need one read at its end, not one per step. Counts are
// whole numbers, exact in any order; with exact_loss (--deterministic) each
// block's loss sum is rounded to a multiple of 2^-20 first
// (fixed_point::round_loss_sum), so the atomicAdds' order cannot change the
// total either.
#include <algorithm>

#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/core/fixed_point.hpp"     // round_loss_sum
#include "ddp/nn/cuda/device.hpp"
#include "ddp/nn/kernel_math.hpp"      // argmax_row, softmax_xent_row
#include "ddp/runtime/block_sum.cuh"  // block_sum
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

constexpr int kThreads = 256;  // a power of two: the block sum halves it

// With kLoss: writes d(mean loss)/d(logits) (if dlogits) and adds the summed
// loss to *loss_sum (NaN for a label outside [0, classes): softmax_xent_row);
// always adds the rows whose arg-max is the label to *correct. `batch` rows
// from row blockIdx.y * batch on: the rows of the y-th call of a launch that
// stands for gridDim.y calls of `batch` rows each (micro-shards), each block
// summing what it sums in a call of its own.
template <bool kLoss>
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int batch, int classes,
                float* __restrict__ dlogits, double* __restrict__ loss_sum, double* __restrict__ correct,
                int grad_batch, bool exact_loss) {
  __shared__ double s[kThreads];
  double loss = 0.0, right = 0.0;
  const double inv_batch = 1.0 / grad_batch;
  const int64_t first = int64_t(blockIdx.y) * batch;
  logits += first * classes;
  labels += first;
  if (dlogits) dlogits += first * classes;
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < batch; r += gridDim.x * blockDim.x) {
    const float* z = logits + int64_t(r) * classes;
    const int best = kernel::argmax_row(z, classes);
    right += best == labels[r] ? 1.0 : 0.0;
    if (kLoss)
      loss += kernel::softmax_xent_row(z, best, labels[r], classes, inv_batch,
                                       dlogits ? dlogits + int64_t(r) * classes : nullptr);
  }
  if (kLoss) {
    cuda::block_sum<kThreads>(s, loss);
    if (threadIdx.x == 0) atomicAdd(loss_sum, exact_loss ? fixed_point::round_loss_sum(s[0]) : s[0]);
    __syncthreads();  // s is reused below
  }
  cuda::block_sum<kThreads>(s, right);
  if (threadIdx.x == 0) atomicAdd(correct, s[0]);
}

unsigned grid_for(int batch) { return unsigned(std::min((batch + kThreads - 1) / kThreads, 1024)); }

}  // namespace

void softmax_cross_entropy_cuda(const float* logits, const int32_t* labels, int batch, int classes, float* dlogits,
                                double* sums, cudaStream_t stream, int grad_batch, bool exact_loss, int shard) {
  DDP_CHECK(classes > 0, "softmax_cross_entropy_cuda: classes must be positive, got ", classes);
  DDP_CHECK(batch > 0, "softmax_cross_entropy_cuda: empty batch");
  DDP_CHECK(logits && labels && sums, "softmax_cross_entropy_cuda: null logits, labels or sums");
  if (shard <= 0) shard = batch;
  DDP_CHECK(batch % shard == 0 && batch / shard <= 65535, "softmax_cross_entropy_cuda: a batch of ", batch,
            " in micro-shards of ", shard);
  // grad_batch 0 is the mean over one call's rows: here, which rows is not clear.
  DDP_CHECK(shard == batch || grad_batch > 0, "softmax_cross_entropy_cuda: micro-shards without grad_batch");
  const dim3 grid(grid_for(shard), unsigned(batch / shard));
  rows_kernel<true><<<grid, kThreads, 0, stream>>>(logits, labels, shard, classes, dlogits, sums, sums + 1,
                                                   grad_batch > 0 ? grad_batch : batch, exact_loss);
  DDP_CUDA_CHECK_LAUNCH(rows_kernel<true>);
}

void count_correct_cuda(const float* logits, const int32_t* labels, int batch, int classes, double* correct,
                        cudaStream_t stream) {
  DDP_CHECK(classes > 0, "count_correct_cuda: classes must be positive, got ", classes);
  if (batch <= 0) return;
  DDP_CHECK(logits && labels && correct, "count_correct_cuda: null logits, labels or correct");
  rows_kernel<false><<<grid_for(batch), kThreads, 0, stream>>>(logits, labels, batch, classes, nullptr, nullptr,
                                                               correct, batch, false);
  DDP_CUDA_CHECK_LAUNCH(rows_kernel<false>);
}

}  // namespace ddp::nn
