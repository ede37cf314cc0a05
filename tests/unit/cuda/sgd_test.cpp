// sgd_step_cuda against sgd_step (sgd.cpp, PyTorch's order): three steps of
// each variant on a buffer of several blocks; parameters and the momentum
// buffer agree to a few float roundings (the GPU may fuse multiply-adds).
#include <gtest/gtest.h>

#include <vector>

#include "ddp/optim/sgd.hpp"       // sgd_step, SgdOptions: the reference
#include "ddp/optim/sgd_cuda.hpp"  // sgd_step_cuda
#include "nn_cuda_test_util.hpp"

namespace ddp::optim {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::normal;

class CudaSgd : public nn_cuda_test::GpuTest {
 protected:
  void check(const SgdOptions& opt) {
    for (size_t n : {size_t(3), size_t(100003)}) {
      SCOPED_TRACE("n " + std::to_string(n));
      std::vector<float> p = normal(n, 1), m(n);
      DeviceArray<float> gp(ctx(), p), gg(ctx(), n), gm(ctx(), n);
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> g = normal(n, 10 + uint64_t(step), 0.5);
        gg.upload(g);
        sgd_step(opt, step == 0, n, p.data(), g.data(), opt.momentum != 0 ? m.data() : nullptr);
        sgd_step_cuda(opt, step == 0, n, gp.get(), gg.get(), opt.momentum != 0 ? gm.get() : nullptr,
                      ctx().compute());
        EXPECT_TRUE(agrees(gp.download(), p, 1e-5)) << "params after step " << step;
        if (opt.momentum != 0) {
          EXPECT_TRUE(agrees(gm.download(), m, 1e-5)) << "momentum buffer";
        }
      }
    }
  }
};

TEST_F(CudaSgd, Plain) { check({0.2, 0, 0, 0, false}); }
TEST_F(CudaSgd, WeightDecay) { check({0.1, 0, 0, 0.01, false}); }
TEST_F(CudaSgd, Momentum) { check({0.1, 0.9, 0, 1e-4, false}); }
TEST_F(CudaSgd, MomentumDampening) { check({0.1, 0.9, 0.3, 1e-3, false}); }
TEST_F(CudaSgd, Nesterov) { check({0.1, 0.9, 0, 1e-4, true}); }

TEST_F(CudaSgd, MomentumWithoutBufferIsAnError) {
  DeviceArray<float> p(ctx(), 4), g(ctx(), 4);
  EXPECT_THROW(sgd_step_cuda({0.1, 0.9, 0, 0, false}, true, 4, p.get(), g.get(), nullptr, ctx().compute()), Error);
}

}  // namespace
}  // namespace ddp::optim
