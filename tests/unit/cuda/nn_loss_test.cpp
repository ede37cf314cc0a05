// The loss and accuracy kernels against softmax_cross_entropy and
// count_correct on the CPU: gradients, the summed loss and correct count ADDED
// to the device totals, and arg-max ties broken the same way (first maximum).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ddp/core/rng.hpp"       // labels
#include "ddp/nn/cuda/device.hpp"  // softmax_cross_entropy_cuda, count_correct_cuda
#include "ddp/nn/model.hpp"       // softmax_cross_entropy, count_correct
#include "nn_cuda_test_util.hpp"

namespace ddp::nn {
namespace {

using nn_cuda_test::agrees;
using nn_cuda_test::DeviceArray;
using nn_cuda_test::normal;

class CudaLoss : public nn_cuda_test::GpuTest {
 protected:
  void check(int batch, int classes, const std::vector<float>& logits, const std::vector<int32_t>& labels);
};

// Totals start nonzero, so a kernel that overwrote them would fail.
void CudaLoss::check(int batch, int classes, const std::vector<float>& logits, const std::vector<int32_t>& labels) {
  SCOPED_TRACE("batch " + std::to_string(batch) + " classes " + std::to_string(classes));
  std::vector<float> dlogits(logits.size());
  const float loss = softmax_cross_entropy(logits.data(), labels.data(), batch, classes, dlogits.data());
  const int64_t correct = count_correct(logits.data(), labels.data(), batch, classes);

  DeviceArray<float> gl(ctx(), logits), gd(ctx(), logits.size());
  DeviceArray<int32_t> glab(ctx(), labels);
  DeviceArray<double> sums(ctx(), std::vector<double>{1.5, 2.0}), right(ctx(), std::vector<double>{5.0});
  softmax_cross_entropy_cuda(gl.get(), glab.get(), batch, classes, gd.get(), sums.get(), ctx().compute());
  count_correct_cuda(gl.get(), glab.get(), batch, classes, right.get(), ctx().compute());

  EXPECT_TRUE(agrees(gd.download(), dlogits, 1e-6)) << "dlogits";
  const std::vector<double> s = sums.download();
  EXPECT_NEAR((s[0] - 1.5) / batch, double(loss), 1e-5 * std::max(1.0, std::fabs(double(loss)))) << "loss";
  EXPECT_EQ(s[1] - 2.0, double(correct)) << "correct, from the loss kernel";
  EXPECT_EQ(right.download()[0] - 5.0, double(correct)) << "count_correct_cuda";
}

std::vector<int32_t> random_labels(int batch, int classes, uint64_t seed) {
  Rng rng(seed, 17);
  std::vector<int32_t> l(static_cast<size_t>(batch));
  for (int32_t& v : l) v = int32_t(rng.below(uint64_t(classes)));
  return l;
}

TEST_F(CudaLoss, MatchesCpu) {
  // Over one block of rows and over several (300, 1000), and large logits
  // that need the max shift.
  for (int batch : {1, 7, 64, 300, 1000})
    for (int classes : {1, 3, 10}) {
      const size_t n = size_t(batch) * classes;
      check(batch, classes, normal(n, 3, 3.0), random_labels(batch, classes, 4));
      check(batch, classes, normal(n, 5, 80.0), random_labels(batch, classes, 6));
    }
}

TEST_F(CudaLoss, TiesGoToTheFirstMaximum) {
  const int classes = 4;
  const std::vector<float> logits = {
      1, 1, 1, 1,  // all tied: class 0
      1, 1, 1, 1,  // label 3 is not the arg-max
      1, 5, 5, 2,  // tie between 1 and 2: class 1
      1, 5, 5, 2,  // label 2 is not the arg-max
      0, 0, 0, 9,  // plain maximum
  };
  check(5, classes, logits, {0, 3, 1, 2, 3});
}

}  // namespace
}  // namespace ddp::nn
