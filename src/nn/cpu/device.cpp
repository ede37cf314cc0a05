// The CPU device (nn/device.hpp): host memory, and per op kind a Kernel over
// the free functions of nn/cpu/ops.hpp, on the device's thread pool.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "ddp/nn/cpu/kernels.hpp"

namespace ddp::nn::cpu {

namespace {

// Zeroed host memory. Large arrays (activations: ResNet-18 at batch 256
// holds 1.4 GB of them) are mapped on their own with transparent huge pages
// asked for, so that the first step faults them in 2 MiB at a time rather
// than 4 KiB, and the GEMMs and im2col that stream through them miss the TLB
// less.
class CpuArray final : public Array {
 public:
  explicit CpuArray(size_t n) : n_(n) {
    const size_t bytes = n * sizeof(float);
    if (bytes < kMapBytes) {
      small_.assign(n, 0.0f);
      p_ = small_.data();
      return;
    }
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    madvise(m, bytes, MADV_HUGEPAGE);  // advice: where refused, 4 KiB pages still work
    p_ = static_cast<float*>(m);
    mapped_ = true;
  }
  ~CpuArray() override {
    if (mapped_) munmap(p_, n_ * sizeof(float));
  }
  CpuArray(const CpuArray&) = delete;
  CpuArray& operator=(const CpuArray&) = delete;
  float* data() override { return p_; }
  size_t size() const override { return n_; }

 private:
  static constexpr size_t kMapBytes = size_t(4) << 20;
  size_t n_;
  float* p_ = nullptr;
  bool mapped_ = false;
  std::vector<float> small_;
};

}  // namespace

CpuDevice::CpuDevice(int threads) : pool_(std::max(1, threads)) {}

std::unique_ptr<Array> CpuDevice::alloc(size_t n) { return std::make_unique<CpuArray>(n); }

void CpuDevice::fill(float* p, size_t n, float value) { std::fill(p, p + n, value); }

void CpuDevice::add(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void CpuDevice::scale(float* p, size_t n, float s) {
  for (size_t i = 0; i < n; ++i) p[i] *= s;
}

void CpuDevice::round(float* dst, const float* src, size_t n, Precision prec) {
  if (prec == Precision::BF16)
    for (size_t i = 0; i < n; ++i) dst[i] = round_to(Precision::BF16, src[i]);
  else if (prec == Precision::F16)
    for (size_t i = 0; i < n; ++i) dst[i] = round_to(Precision::F16, src[i]);
  else if (dst != src && n)
    std::memcpy(dst, src, n * sizeof(float));
}

void CpuDevice::to_host(float* host, const float* dev, size_t n) {
  if (n) std::memcpy(host, dev, n * sizeof(float));
}

void CpuDevice::from_host(float* dev, const float* host, size_t n) {
  if (n) std::memcpy(dev, host, n * sizeof(float));
}

}  // namespace ddp::nn::cpu

namespace ddp::nn {

std::unique_ptr<Device> make_cpu_device(int threads) { return std::make_unique<cpu::CpuDevice>(threads); }

}  // namespace ddp::nn
