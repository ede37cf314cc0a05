// The GPU optimizer kernels (kernels_cuda.cu) against the CPU ones
// (kernels_cpu.cpp): SGD and AdamW, with parameter groups and clipping,
// three steps on a buffer of several blocks; the norm's bits are the same
// call after call.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ddp/nn/cuda/device.hpp"   // make_cuda_device
#include "ddp/optim/kernels.hpp"    // make_cpu_kernels, make_cuda_kernels
#include "ddp/optim/optimizer.hpp"  // Optimizer
#include "nn_cuda_test_util.hpp"

namespace ddp::optim {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::normal;

class CudaOptimizer : public nn_cuda_test::GpuTest {
 protected:
  // unscale: the loss scaler's 1/scale (--precision fp16), applied before
  // the clipping norm as on the CPU.
  void check(const Options& o, float unscale = 1.0f) {
    for (size_t n : {size_t(3), size_t(100003)}) {
      SCOPED_TRACE("n " + std::to_string(n));
      // A weight and a bias, so that no_decay_norm_bias has two groups.
      std::vector<nn::TensorInfo> t(2);
      t[0].name = "w";
      t[0].shape = {int64_t(n - 1), 1};
      t[0].numel = n - 1;
      t[1].name = "b";
      t[1].shape = {1};
      t[1].offset = n - 1;
      t[1].numel = 1;
      auto cpu_dev = nn::make_cpu_device(1);
      auto gpu_dev = nn::make_cuda_device(ctx());
      auto cpu_k = make_cpu_kernels();
      auto gpu_k = make_cuda_kernels(ctx().compute());
      Optimizer cpu(o, t, *cpu_dev, *cpu_k), gpu(o, t, *gpu_dev, *gpu_k);
      std::vector<float> p = normal(n, 1);
      DeviceArray<float> gp(ctx(), p), gg(ctx(), n);
      for (int step = 0; step < 3; ++step) {
        std::vector<float> g = normal(n, 10 + uint64_t(step), 0.5);
        for (float& x : g) x /= unscale;  // as scaled by the loss scale (a power of two: exact)
        gg.upload(g);
        cpu.step(0.05, p.data(), g.data(), unscale);
        gpu.step(0.05, gp.get(), gg.get(), unscale);
        EXPECT_TRUE(agrees(gp.download(), p, 1e-5)) << "params after step " << step;
      }
      State cs, gs;
      cpu.get_state(cs);
      gpu.get_state(gs);
      ASSERT_EQ(cs.buffers.size(), gs.buffers.size());
      // Relative to each buffer's own scale: clipped gradients leave AdamW's
      // moments far below 1, where agrees()'s absolute floor would pass
      // anything.
      for (size_t i = 0; i < cs.buffers.size(); ++i) {
        ASSERT_EQ(gs.buffers[i].second.size(), cs.buffers[i].second.size()) << cs.buffers[i].first;
        EXPECT_TRUE(nn_cuda_test::agrees_in_scale(gs.buffers[i].second.data(), cs.buffers[i].second.data(),
                                                  cs.buffers[i].second.size(), 1e-5))
            << cs.buffers[i].first;
      }
      const double cpu_norms = cpu.take_norm_sum();
      EXPECT_NEAR(gpu.take_norm_sum(), cpu_norms, 1e-9 * (1 + cpu_norms));
    }
  }
};

Options sgd(double mu, double wd, bool nesterov = false) {
  Options o;
  o.momentum = mu;
  o.weight_decay = wd;
  o.nesterov = nesterov;
  return o;
}

Options adamw(double wd) {
  Options o;
  o.kind = Kind::AdamW;
  o.weight_decay = wd;
  return o;
}

TEST_F(CudaOptimizer, SgdPlain) { check(sgd(0, 0)); }
TEST_F(CudaOptimizer, SgdMomentum) { check(sgd(0.9, 1e-4)); }
TEST_F(CudaOptimizer, SgdNesterov) { check(sgd(0.9, 1e-4, true)); }
TEST_F(CudaOptimizer, AdamW) { check(adamw(0.01)); }
TEST_F(CudaOptimizer, AdamWNoDecayNormBiasClipped) {
  Options o = adamw(0.1);
  o.no_decay_norm_bias = true;
  o.max_grad_norm = 0.5;
  check(o);
}

// fp16's loss scaler: gradients scaled by 1024 come with unscale 1/1024,
// which the norm and the update take out.
TEST_F(CudaOptimizer, AdamWClippedUnscalesAsTheCpu) {
  Options o = adamw(0.01);
  o.max_grad_norm = 0.5;
  check(o, 1.0f / 1024);
}

TEST_F(CudaOptimizer, NormIsTheSameBitsEveryCall) {
  const size_t n = 1000003;
  DeviceArray<float> g(ctx(), normal(n, 3));
  auto k = make_cuda_kernels(ctx().compute());
  std::vector<double> got;
  for (int i = 0; i < 3; ++i) {
    const double* sq = k->sq_norm(g.get(), n);
    double h = 0;
    ASSERT_EQ(cudaMemcpyAsync(&h, sq, sizeof h, cudaMemcpyDeviceToHost, ctx().compute()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(ctx().compute()), cudaSuccess);
    got.push_back(h);
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0], got[2]);
  EXPECT_GT(got[0], 0.0);
}

// fp16's found_inf on the device: the flag the host reads instead of the
// gradients, against the CPU kernels' at every place a NaN or an infinity
// may sit (a warp's last thread, a block's, the grid's last in its first
// stride and the first in its second: the grid holds 4096 blocks of 256).
TEST_F(CudaOptimizer, NonFiniteFlagIsTheCpus) {
  const size_t n = 2000003;
  const std::vector<float> g = normal(n, 5);
  DeviceArray<float> d(ctx(), g);
  auto gpu = make_cuda_kernels(ctx().compute());
  auto cpu = make_cpu_kernels();
  auto flag = [&](size_t count) {
    const unsigned* f = gpu->non_finite(d.get(), count);
    unsigned h = 7;
    EXPECT_EQ(cudaMemcpyAsync(&h, f, sizeof h, cudaMemcpyDeviceToHost, ctx().compute()), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(ctx().compute()), cudaSuccess);
    return h != 0;
  };
  EXPECT_FALSE(flag(n));
  EXPECT_FALSE(flag(0));
  for (size_t at : {size_t(0), size_t(31), size_t(255), size_t(256), size_t(4096 * 256 - 1), size_t(4096 * 256),
                    n - 1})
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> h = g;
      h[at] = bad;
      d.upload(h);
      EXPECT_TRUE(flag(n)) << bad << " at " << at;
      EXPECT_EQ(flag(n), *cpu->non_finite(h.data(), n) != 0) << bad << " at " << at;
      EXPECT_FALSE(flag(at)) << "the values before " << at;
    }
}

}  // namespace
}  // namespace ddp::optim
