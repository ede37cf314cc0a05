// The GPU device (nn/device.hpp) on one cuda::Context: memory from the
// context's stream-ordered pool, and for each op kind a kernel of
// src/nn/cuda/*.cu. Every op runs on the context's compute stream; nothing
// here synchronises the host unless it says so.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ddp/nn/device.hpp"
#include "ddp/nn/layout.hpp"             // Layout: Note [channels last]
#include "ddp/runtime/cuda_context.hpp"  // cuda::Context

namespace ddp::nn {

// What a CudaDevice may choose for itself, and what tests pin.
struct CudaDeviceOptions {
  // Every kernel in this layout, whatever the graph (the layer tests
  // compare the layouts op by op); unset: the context's --channels-last
  // where the graph allows it.
  std::optional<Layout> layout;
  // Note [claimed runs] (nn/model.hpp) with --gpu-kernels proven; false: op by
  // op (the tests' reference).
  bool claim_runs = true;
};

class CudaDevice : public Device {
 public:
  explicit CudaDevice(cuda::Context& ctx, CudaDeviceOptions options = {}) : ctx_(ctx), options_(std::move(options)) {}
  std::string name() const override;
  std::unique_ptr<Kernel> kernel(const Graph& g, size_t i, StatsReducer* stats) override;
  std::unique_ptr<Array> alloc(size_t n) override;
  void fill(float* p, size_t n, float value) override;
  void add(float* dst, const float* src, size_t n) override;
  void scale(float* p, size_t n, float s) override;
  void round(float* dst, const float* src, size_t n, Precision prec) override;
  void to_host(float* host, const float* dev, size_t n) override;
  void from_host(float* dev, const float* host, size_t n) override;
  void sync() override;

 protected:
  // The layout g's kernels run in here: the context's --channels-last where
  // g allows it (plan_layout; the start-up lines say which), or the one this
  // device was made with.
  Layout layout(const Graph& g);
  cuda::Context& ctx_;

 private:
  // The buffer CudaConvBn's runs share for a gradient (kernels.hpp).
  std::shared_ptr<cuda::DeviceBuffer> run_grads();
  CudaDeviceOptions options_;
  std::shared_ptr<cuda::DeviceBuffer> run_grads_;
};

std::unique_ptr<Device> make_cuda_device(cuda::Context& ctx, CudaDeviceOptions options = {});

// Softmax cross-entropy on the device, one launch: writes d(mean loss)/d(logits)
// into dlogits (the mean over grad_batch samples where it is > 0, as on the
// CPU) and ADDS the batch's summed loss to sums[0] and its number of
// correct rows (arg-max == label) to sums[1] (device doubles), so a whole epoch
// runs without the host reading anything. With exact_loss (--deterministic)
// the loss is added in multiples of 2^-20 (nn/cuda/loss.cu), the same total in
// any order. With shard > 0 (dividing batch) the batch is micro-shards of
// `shard` rows, each summed (and rounded) as a call of its own would, in one
// launch.
void softmax_cross_entropy_cuda(const float* logits, const int32_t* labels, int batch, int classes,
                                float* dlogits, double* sums, cudaStream_t stream, int grad_batch = 0,
                                bool exact_loss = false, int shard = 0);
// Adds the number of rows whose arg-max equals the label to *correct (device).
void count_correct_cuda(const float* logits, const int32_t* labels, int batch, int classes, double* correct,
                        cudaStream_t stream);

}  // namespace ddp::nn
