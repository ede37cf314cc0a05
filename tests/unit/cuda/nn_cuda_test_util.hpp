// What the GPU nn and optim tests share: the skip without a device, device
// arrays whose copies are ordered on the context's compute stream, random
// inputs, and the "agrees with the CPU" comparison.
//
// Copies go through cudaMemcpyAsync on ctx.compute() and ctx.sync(), never
// plain cudaMemcpy: the compute stream is non-blocking, so the legacy
// default stream a plain cudaMemcpy uses is not ordered against it.
#pragma once

#include <cuda_runtime_api.h>  // cudaMemcpyAsync, cudaFreeAsync
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/rng.hpp"              // Rng: the same inputs on every machine
#include "ddp/nn/model.hpp"              // Model: the twins an OptimizerPair steps
#include "ddp/optim/kernels.hpp"         // make_cpu_kernels, make_cuda_kernels
#include "ddp/optim/optimizer.hpp"       // Optimizer
#include "ddp/runtime/cuda_check.hpp"    // DDP_CUDA_CHECK
#include "ddp/runtime/cuda_context.hpp"  // cuda::Context, cuda::device_count
#include "../nn/layout_util.hpp"         // to_layout, from_layout

namespace ddp::nn_cuda_test {

// Base of every GPU fixture: skipped without a device, else a Context on
// device 0 for the test.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
    ctx_ = std::make_unique<cuda::Context>(0);
  }
  cuda::Context& ctx() { return *ctx_; }

 private:
  std::unique_ptr<cuda::Context> ctx_;
};

// n elements of T on the device, from the context's pool.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(cuda::Context& ctx, size_t n) : ctx_(&ctx), n_(n), p_(static_cast<T*>(ctx.alloc(n * sizeof(T)))) {}
  DeviceArray(cuda::Context& ctx, const std::vector<T>& h) : DeviceArray(ctx, h.size()) { upload(h); }
  ~DeviceArray() {
    if (p_) cudaFreeAsync(p_, ctx_->compute());
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& h) {
    EXPECT_EQ(h.size(), n_);
    const size_t n = std::min(h.size(), n_);
    if (n) DDP_CUDA_CHECK(cudaMemcpyAsync(p_, h.data(), n * sizeof(T), cudaMemcpyHostToDevice, ctx_->compute()));
    ctx_->sync();
  }
  std::vector<T> download() const { return to_host(*ctx_, p_, n_); }

  static std::vector<T> to_host(cuda::Context& ctx, const T* d, size_t n) {
    std::vector<T> h(n);
    if (n) DDP_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, ctx.compute()));
    ctx.sync();
    return h;
  }

 private:
  cuda::Context* ctx_;
  size_t n_;
  T* p_;
};

inline std::vector<float> to_host(cuda::Context& ctx, const float* d, size_t n) {
  return DeviceArray<float>::to_host(ctx, d, n);
}

inline std::vector<float> normal(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed, 11);
  std::vector<float> v(n);
  for (float& x : v) x = float(scale * rng.normal());
  return v;
}

// A training step's inputs: images in [0, 1) as the loader gives them, and
// uniform labels, the same on every machine for the same step.
struct StepInputs {
  std::vector<float> x;
  std::vector<int32_t> labels;
};
inline StepInputs step_inputs(int step, int batch, size_t image_floats, int classes) {
  Rng rng(7, uint64_t(step));
  StepInputs in{std::vector<float>(size_t(batch) * image_floats), std::vector<int32_t>(size_t(batch))};
  for (float& v : in.x) v = rng.uniform();
  for (int32_t& l : in.labels) l = int32_t(rng.below(uint64_t(classes)));
  return in;
}

// Batches between the CPU's layout and the GPU's (Note [channels last]).
using nn::test::from_layout;
using nn::test::to_layout;

// Floats as their bits: equal means bitwise equal (0.0 and -0.0 differ).
inline std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// The same optimizer over a CPU model's parameters and a GPU model's, each
// on its device's kernels.
struct OptimizerPair {
  OptimizerPair(cuda::Context& ctx, const optim::Options& opt, nn::Model& cpu_model, nn::Model& gpu_model)
      : cpu_kernels(optim::make_cpu_kernels()),
        gpu_kernels(optim::make_cuda_kernels(ctx.compute())),
        cpu(opt, cpu_model.param_info(), cpu_model.device(), *cpu_kernels),
        gpu(opt, gpu_model.param_info(), gpu_model.device(), *gpu_kernels) {}
  std::unique_ptr<optim::Kernels> cpu_kernels, gpu_kernels;
  optim::Optimizer cpu, gpu;
};

// Multiples of step in [-range, range] * step, plus offset: products and sums
// of such values are exact in float, so a convolution over them gives the same
// value on both devices whatever the order of summation.
inline std::vector<float> on_grid(size_t n, uint64_t seed, float step, int range, float offset = 0.0f) {
  Rng rng(seed, 13);
  std::vector<float> v(n);
  for (float& x : v) x = step * float(int(rng.below(uint64_t(2 * range + 1))) - range) + offset;
  return v;
}

// max |got - want| <= tol * max(floor, max |want|) over n values.
inline ::testing::AssertionResult agrees_within(const float* got, const float* want, size_t n, double tol,
                                                double floor) {
  double scale = floor, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    scale = std::max(scale, double(std::fabs(want[i])));
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (std::isnan(d))
      return ::testing::AssertionFailure() << "NaN at " << i << " (gpu " << got[i] << ", cpu " << want[i] << ")";
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |gpu - cpu| = " << worst << " at " << at << " (gpu " << got[at]
                                       << ", cpu " << want[at] << ") > " << tol << " * " << scale;
}

// Agreement to tol relative to the tensor's scale, absolute for tensors of
// small values: max |got - want| <= tol * max(1, max |want|).
inline ::testing::AssertionResult agrees(const std::vector<float>& got, const std::vector<float>& want,
                                         double tol = 1e-4) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: gpu " << got.size() << ", cpu " << want.size();
  return agrees_within(got.data(), want.data(), got.size(), tol, 1.0);
}

// Agreement relative to the tensor's own largest value, however small.
inline ::testing::AssertionResult agrees_in_scale(const float* got, const float* want, size_t n, double tol) {
  return agrees_within(got, want, n, tol, 0.0);
}

}  // namespace ddp::nn_cuda_test
