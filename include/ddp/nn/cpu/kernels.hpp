// The CPU device (nn/device.hpp): host memory, and per op kind a Kernel over
// the free functions of nn/cpu/ops.hpp on the device's thread pool. The
// kernels that other devices build on (the deterministic mode's, in
// deterministic/) are declared here; the others are kernels.cpp's alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/cpu/ops.hpp"          // ConvGeom, ConvScratch
#include "ddp/nn/cpu/thread_pool.hpp"  // ThreadPool
#include "ddp/nn/device.hpp"           // Device, Kernel, OpArgs

namespace ddp::nn::cpu {

// Op's convolution geometry for a batch of `batch` images.
ConvGeom conv_geom(const Op& op, int batch);

// conv2d on the pool: im2col + GEMM, or Winograd's algorithm where it
// applies (nn/cpu/ops.hpp).
class Conv : public Kernel {
 public:
  Conv(const Op& op, ThreadPool* pool) : op_(op), pool_(pool) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 protected:
  const Op& op_;
  ThreadPool* pool_;

 private:
  ConvScratch<float> scratch_;
};

// conv -> relu -> avgpool2 in one pass (conv_relu_pool.cpp); backward needs
// the relu mask of the same batch's forward, kept image by image.
class ConvReluPool : public Kernel {
 public:
  ConvReluPool(const Op& op, ThreadPool* pool);
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 protected:
  // Masks for a batch of `batch` images (from the next forward on).
  void size_mask(int batch);
  // a's images as images first .. first + a.batch of the batch the masks
  // were sized for, with scratch s on `threads` (nullptr: the calling thread).
  void forward_at(const OpArgs& a, int64_t first, ConvScratch<float>& s, ThreadPool* threads);
  void backward_at(const OpArgs& a, int64_t first, const float* dy, const std::vector<float*>& dx,
                   ConvScratch<float>& s, ThreadPool* threads);
  const Op& op_;
  ThreadPool* pool_;

 private:
  ConvScratch<float> scratch_;
  size_t image_mask_;  // bytes of relu mask per image
  std::vector<uint8_t> mask_;
  int mask_batch_ = -1;
};

// torch.nn.BatchNorm2d (nn/cpu/ops.hpp's steps); with a StatsReducer the
// batch statistics and the backward's sums are summed over ranks
// (SyncBatchNorm).
class BatchNorm : public Kernel {
 public:
  BatchNorm(const Op& op, ThreadPool* pool, StatsReducer* stats);
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 protected:
  // sum(first, images, out): `width` per-channel sums of images first ..
  // first + images of the call's batch into out (backward's also add their
  // part of the weight and bias gradients).
  using RunSum = std::function<void(int64_t first, int images, double* out)>;
  // A call's per-channel sums, into out: here sum over the whole batch, then
  // over the ranks with a StatsReducer. backward: the sums are backward's.
  virtual void channel_sums(const OpArgs& a, size_t width, const RunSum& sum, double* out, const std::string& what,
                            bool backward);
  const Op& op_;
  ThreadPool* pool_;
  StatsReducer* stats_;
  int c_, hw_;

 private:
  std::vector<float> mean_, invstd_, scale_, shift_;  // of the last training forward (and its scale)
  std::vector<double> s1_, s2_, sums_;              // the batch's (over ranks): forward's, backward's
};

// y = x W^T + b on OpenBLAS, split over the pool (linear.cpp).
class Linear : public Kernel {
 public:
  Linear(const Op& op, ThreadPool* pool) : in_(int(op.in.numel())), out_(op.out_c), pool_(pool) {}
  void forward(const OpArgs& a) override;
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override;

 protected:
  // On `threads` (nullptr: the calling thread).
  void forward_on(const OpArgs& a, ThreadPool* threads);
  void backward_on(const OpArgs& a, const float* dy, const std::vector<float*>& dx, ThreadPool* threads);

 private:
  int in_, out_;
  ThreadPool* pool_;
};

// The CPU device: kernels on `threads` threads of a pool of its own (OpenBLAS
// single-threaded on each: Note [serial OpenBLAS] in nn/cpu/gemm.hpp).
class CpuDevice : public Device {
 public:
  explicit CpuDevice(int threads);
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Kernel> kernel(const Graph& g, size_t i, StatsReducer* stats) override;
  std::unique_ptr<Array> alloc(size_t n) override;
  void fill(float* p, size_t n, float value) override;
  void add(float* dst, const float* src, size_t n) override;
  void scale(float* p, size_t n, float s) override;
  void round(float* dst, const float* src, size_t n, Precision prec) override;
  void to_host(float* host, const float* dev, size_t n) override;
  void from_host(float* dev, const float* host, size_t n) override;
  void sync() override {}
  ThreadPool& pool() { return pool_; }
  int threads() const { return pool_.size(); }

 private:
  ThreadPool pool_;
};

}  // namespace ddp::nn::cpu
