// --deterministic's fixed-point sum on the GPU (make_cuda_exact_sum) against
// the host's (HostExactGradientSum, checked on any machine in
// unit/ddp/exact_sum_test.cpp): the same micro-shards in give the same verdict
// (done, redo, non-finite), the same exponents after, and the same floats out,
// to the bit. Both run fixed_point.hpp's arithmetic; this checks the kernels
// around it (indexing, the block maximum, the launches per parameter). And
// the loss kernel's exact mode adds in multiples of 2^-20, as the CPU does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../deterministic/add_shard.hpp"  // add_shard: a micro-shard as backward adds it
#include "../one_rank.hpp"          // OneRank: a world of one without MPI
#include "ddp/deterministic/exact_sum.hpp"        // HostExactGradientSum, make_cuda_exact_sum
#include "ddp/core/fixed_point.hpp"      // round_loss_sum
#include "ddp/nn/cuda/device.hpp"       // softmax_cross_entropy_cuda
#include "ddp/nn/model.hpp"             // softmax_cross_entropy (the CPU's)
#include "nn_cuda_test_util.hpp"

namespace ddp::nn_cuda_test {
namespace {

class CudaExactSum : public GpuTest {};

TEST_F(CudaExactSum, VerdictsExponentsAndSumsAreTheHosts) {
  const std::vector<size_t> numels = {300, 7, 1000, 1, 70000};
  size_t n = 0;
  for (size_t k : numels) n += k;
  const int shards = 8;
  test::OneRank one;
  HostExactGradientSum host(numels, shards);
  auto gpu = make_cuda_exact_sum(numels, shards, ctx(), [this](const std::string&) { ctx().sync(); });
  // Note [shard gradients together]: every micro-shard at once, in one add_shards.
  auto together = make_cuda_exact_sum(numels, shards, ctx(), [this](const std::string&) { ctx().sync(); });
  DeviceArray<float> g(ctx(), n), out(ctx(), n), all(ctx(), n * shards);
  std::vector<float> all_host(n * shards);
  std::vector<float> want(n);
  int redone = 0;
  // Small gradients (done), large ones the first exponents cannot hold (a
  // redo, then done), tiny ones, then one NaN among them.
  const std::vector<double> scales = {1e-2, 1e3, 1e3, 1e-7, 1e-7};
  for (size_t step = 0; step < scales.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    host.begin_step();
    gpu->begin_step();
    together->begin_step();
    for (int s = 0; s < shards; ++s) {
      std::vector<float> v = normal(n, 100 * step + uint64_t(s), scales[step]);
      if (step + 1 == scales.size() && s == 3) v[n - 5] = std::numeric_limits<float>::quiet_NaN();
      test::add_shard(host, numels, v.data());
      g.upload(v);  // after the previous shard's kernels: the same stream
      test::add_shard(*gpu, numels, g.get());
      std::copy(v.begin(), v.end(), all_host.begin() + std::ptrdiff_t(s * n));
    }
    all.upload(all_host);
    together->add_shards(0, all.get(), n, shards, 0, numels.size());
    const auto want_r = host.finish(one, want.data());
    const auto got_r = gpu->finish(one, out.get());
    ASSERT_EQ(int(got_r), int(want_r));
    {
      DeviceArray<float> out_together(ctx(), n);
      ASSERT_EQ(int(together->finish(one, out_together.get())), int(want_r));
      EXPECT_EQ(together->exponents(), host.exponents());
      if (want_r == ExactGradientSum::Result::Done) {
        EXPECT_EQ(bits(out_together.download()), bits(want));
      }
    }
    redone += got_r == ExactGradientSum::Result::Redo;
    EXPECT_EQ(gpu->exponents(), host.exponents());
    const std::vector<float> got = out.download();
    if (want_r == ExactGradientSum::Result::Done) {
      EXPECT_EQ(bits(got), bits(want));
    } else if (want_r == ExactGradientSum::Result::NonFinite) {
      for (float v : got) ASSERT_TRUE(std::isnan(v));
    }
  }
  EXPECT_EQ(redone, 1);
}

// Under --deterministic the loss is added in multiples of 2^-20 on the device
// too: sums of such values are exact in double, whatever order the blocks'
// atomicAdds land in.
TEST_F(CudaExactSum, ExactLossAddsRoundedBatchSums) {
  const int batch = 200, classes = 10;
  const std::vector<float> logits = normal(size_t(batch) * classes, 7);
  std::vector<int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) labels[size_t(i)] = i % classes;
  DeviceArray<float> gl(ctx(), logits), gd(ctx(), logits.size());
  DeviceArray<int32_t> glab(ctx(), labels);
  DeviceArray<double> sums(ctx(), std::vector<double>(2, 0.0));
  for (int rep = 0; rep < 2; ++rep)
    nn::softmax_cross_entropy_cuda(gl.get(), glab.get(), batch, classes, gd.get(), sums.get(), ctx().compute(), 0,
                               /*exact_loss=*/true);
  const std::vector<double> got = sums.download();
  std::vector<float> dl(logits.size());
  const double cpu = double(nn::softmax_cross_entropy(logits.data(), labels.data(), batch, classes, dl.data())) *
                     batch;
  // A multiple of 2^-20 (one block of 256 rows: one rounded sum per call; a
  // plain double sum of 200 losses almost never is), and the CPU's sum within
  // the float rounding of its mean.
  EXPECT_EQ(got[0], fixed_point::round_loss_sum(got[0]));
  EXPECT_NEAR(got[0], 2 * cpu, 1e-4 * std::fabs(cpu));
}

// --gpu-kernels next (shards-together): a batch's micro-shards' losses in one
// launch are what a launch a micro-shard gives: each micro-shard's rounded
// sum (so the same total) and the same d(loss)/d(logits) bits, for
// micro-shards of fewer and of more rows than a block holds.
TEST_F(CudaExactSum, MicroShardLossesInOneLaunchAreALaunchAMicroShards) {
  const int classes = 10;
  for (const int shard : {16, 300}) {
    SCOPED_TRACE("micro-shards of " + std::to_string(shard));
    const int shards = 4, batch = shards * shard;
    const std::vector<float> logits = normal(size_t(batch) * classes, 8);
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[size_t(i)] = (i * 7) % classes;
    DeviceArray<float> gl(ctx(), logits), one_d(ctx(), logits.size()), each_d(ctx(), logits.size());
    DeviceArray<int32_t> glab(ctx(), labels);
    DeviceArray<double> one_sums(ctx(), std::vector<double>(2, 0.0)), each_sums(ctx(), std::vector<double>(2, 0.0));
    nn::softmax_cross_entropy_cuda(gl.get(), glab.get(), batch, classes, one_d.get(), one_sums.get(), ctx().compute(),
                                   4 * batch, /*exact_loss=*/true, shard);
    for (int k = 0; k < shards; ++k) {
      const size_t at = size_t(k) * shard * classes;
      nn::softmax_cross_entropy_cuda(gl.get() + at, glab.get() + size_t(k) * shard, shard, classes,
                                     each_d.get() + at, each_sums.get(), ctx().compute(), 4 * batch,
                                     /*exact_loss=*/true);
    }
    EXPECT_EQ(one_sums.download(), each_sums.download());
    EXPECT_EQ(bits(one_d.download()), bits(each_d.download()));
  }
}

}  // namespace
}  // namespace ddp::nn_cuda_test
