// resnet18 as a user runs it: BatchNorm's statistics over all ranks with
// --sync-bn (and not without), kill and resume bitwise with its buffers, and
// --train-limit. (Its model file in PyTorch: python_resnet18_torch.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;

const std::string kData = std::string(" --data-dir ") + DDP_DATA_DIR;

// Float tensors' largest difference relative to the largest value, as
// max_rel_diff, for parameters and buffers apart.
struct Diff {
  double params = 0, buffers = 0;
};
Diff differ(const checkpoint::SafetensorsFile& a, const checkpoint::SafetensorsFile& b) {
  checkpoint::SafetensorsFile pa, pb, ba, bb;
  for (const auto& t : a.tensors) {
    const bool buffer = t.name.find("running_") != std::string::npos;
    (buffer ? ba : pa).tensors.push_back(t);
    (buffer ? bb : pb).tensors.push_back(*b.find(t.name));
  }
  return {max_rel_diff(pa, pb), max_rel_diff(ba, bb)};
}

class Resnet : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { remove_tree(dir_); }
  // np ranks of `on` (ranks_on: the CPU's by default) run args.
  checkpoint::SafetensorsFile train(int np, const std::string& args, const std::string& name,
                                    const RanksOn& on = ranks_on("cpu")) {
    const std::string out = dir_ + "/" + name + ".safetensors";
    auto r = run_ddp_train(np, "--model resnet18" + kData + " --quiet " + args + on.flags + " --output-model " + out,
                           on.wrapper);
    EXPECT_EQ(r.status, 0) << r.err;
    return checkpoint::read_safetensors(out);
  }
  std::string dir_;
};

// On the CPU, and over NCCL ranks sharing a GPU (its sums then summed on the
// device, by NCCL).
class SyncBatchNorm : public Resnet, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    Resnet::SetUp();
    if (const std::string why = on_.unfit(); !why.empty()) GTEST_SKIP() << why;
  }
  const RanksOn on_ = ranks_on(GetParam());
};

// SyncBatchNorm: at -np 4 every BatchNorm normalises over the global batch, so
// a step is the -np 1 step (to float rounding) and so are the running
// statistics; without it each rank normalises over its quarter. One step:
// ResNet-18 amplifies rounding fast (other OpenBLAS kernels alone move its
// parameters by 1e-5 of their scale in a step, 5e-4 in two), so one step is
// the horizon where rounding stays far below the semantics' 1e-2. The
// per-rank batch also picks a 3x3 layer's algorithm (winograd_applies and
// winograd_tile: 32 images of the 4x4 layers take F(4x4), 8 take im2col),
// which rounds differently: 1.9e-4 of the parameters' scale with OpenBLAS's
// Haswell kernels when 8 images of the 7x7 layers took im2col too. 1e-3
// keeps a margin on both sides. On a GPU the per-rank batch picks cuDNN's
// algorithms: fp32 rounding, as far below 1e-3; the sums go through NCCL
// on the device (sync-bn-on-device; at one rank nowhere), and with
// --gpu-kernels proven,-sync-bn-on-device through the host.
TEST_P(SyncBatchNorm, AtFourRanksTakesTheOneRankStep) {
  const std::string step = " --train-limit 32 --batch-size 32 --epochs 1 --lr 0.1 --seed 1";
  const auto one = train(1, step + " --sync-bn", "np1_sync", on_);
  for (const std::string kernels : {"", " --gpu-kernels proven,-sync-bn-on-device"}) {
    if (!kernels.empty() && on_.name == "cpu") continue;
    SCOPED_TRACE(kernels);
    if (!kernels.empty()) {
      const Diff host_one = differ(one, train(1, step + " --sync-bn" + kernels, "np1_sync_host", on_));
      EXPECT_LE(host_one.params, 1e-3);
      EXPECT_LE(host_one.buffers, 1e-3);
    }
    const auto four = train(4, step + " --sync-bn" + kernels, "np4_sync", on_);
    const Diff sync = differ(one, four);
    EXPECT_LE(sync.params, 1e-3);
    EXPECT_LE(sync.buffers, 1e-3);
    EXPECT_EQ(one.find("1.num_batches_tracked")->ints, four.find("1.num_batches_tracked")->ints);
  }
  // Without --sync-bn the ranks' statistics are their own: the test can fail.
  const Diff local = differ(one, train(4, step, "np4_local", on_));
  EXPECT_GT(local.params, 1e-2);
  EXPECT_GT(local.buffers, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(On, SyncBatchNorm, ::testing::Values("cpu", "nccl_on_one_gpu"),
                         [](const auto& info) { return info.param; });

// Note [step graphs], over NCCL: the ranks capture and replay their steps
// alike. Four ranks of 37 images a step, 8 steps an epoch, 3 epochs; the
// test set's 594 images give two ranks 149 (five evaluation batches, the
// last of 1) and two 148 (four), so the ranks leave each evaluation in
// other pinned slots, and with other last shapes. The run with graphs ends
// where the run as issued does (cuDNN's algorithms may round apart: float's
// reach, not bits) and counts BatchNorm's batches alike.
class StepGraphs : public SyncBatchNorm {};

TEST_P(StepGraphs, RanksReplayTogetherAcrossEpochsAndEvaluations) {
  const std::string args = "--model resnet18" + kData + " --quiet --batch-size 148 --train-limit 1184 --epochs 3 "
                           "--lr 0.05 --momentum 0.9 --seed 2 --gpu-kernels ";
  for (const std::string kernels : {"next,-step-graphs", "next"}) {
    auto r = run_ddp_train(4, args + kernels + on_.flags + " --output-model " + dir_ + "/" + kernels, on_.wrapper);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err.find("captured as a CUDA graph") != std::string::npos, kernels == "next") << r.err;
  }
  const auto issued = checkpoint::read_safetensors(dir_ + "/next,-step-graphs");
  const auto graphs = checkpoint::read_safetensors(dir_ + "/next");
  const Diff d = differ(issued, graphs);
  EXPECT_LE(d.params, 1e-4);
  EXPECT_LE(d.buffers, 1e-4);
  EXPECT_EQ(issued.find("1.num_batches_tracked")->ints, graphs.find("1.num_batches_tracked")->ints);
}

INSTANTIATE_TEST_SUITE_P(On, StepGraphs, ::testing::Values("nccl_on_one_gpu"),
                         [](const auto& info) { return info.param; });

// Killed mid-epoch and resumed: bitwise the uninterrupted run, parameters,
// running statistics and counters alike.
TEST_F(Resnet, KilledJobResumesBitwiseWithItsBuffers) {
  const std::string args = "--model resnet18" + kData +
                           " --train-limit 192 --batch-size 32 --epochs 2 --lr 0.05 --momentum 0.9 --seed 2 --quiet"
                           " --checkpoint-every 2 --checkpoint-dir ";
  const std::string ck = dir_ + "/ck", ref_ck = dir_ + "/ref";
  auto ref = run_ddp_train(2, args + ref_ck + " --output-model " + dir_ + "/ref.safetensors");
  ASSERT_EQ(ref.status, 0) << ref.err;
  {
    BackgroundJob job(2, args + ck + " --resume auto --output-model " + dir_ + "/resumed.safetensors");
    ASSERT_TRUE(wait_until([&] {
      const auto l = checkpoint::list_checkpoints(ck);
      return !l.empty() && l[0] >= ck + "/" + checkpoint::checkpoint_file_name(4);
    }, 300));
    job.kill_all();
    job.wait();
  }
  ASSERT_FALSE(fs::exists(dir_ + "/resumed.safetensors")) << "the job finished before it was killed";
  auto r = run_ddp_train(2, args + ck + " --resume auto --output-model " + dir_ + "/resumed.safetensors");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
  const auto a = checkpoint::read_safetensors(dir_ + "/ref.safetensors");
  const auto b = checkpoint::read_safetensors(dir_ + "/resumed.safetensors");
  ASSERT_NE(a.find("resnet_block4.1.bn2.running_var"), nullptr);
  expect_bitwise_equal(a, b);
  EXPECT_EQ(a.find("1.num_batches_tracked")->ints, std::vector<int64_t>{12});
}

TEST(TrainLimit, MoreThanTheDatasetIsNamed) {
  expect_failure(run_ddp_train(4, "--synthetic 1000 --train-limit 5000 --epochs 1"),
                 "--train-limit 5000 is more than the 1000 training images of synthetic train");
}

TEST(TrainLimit, TrainsOnTheFirstSamplesAlone) {
  auto r = run_ddp_train(2, "--synthetic 1000 --train-limit 128 --batch-size 32 --epochs 1 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto s = summary_of(r);
  EXPECT_EQ(s["steps_per_epoch"], 4) << "128 samples of 1000, in global batches of 32";
}

}  // namespace
}  // namespace ddp::test
