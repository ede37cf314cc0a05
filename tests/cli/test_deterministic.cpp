// --deterministic as a user relies on it: the same parameters, to the bit, at
// every world size that shares the micro-shards, and after a kill and a resume
// on another world size (Note [fixed-point gradients], deterministic/exact_sum.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;

// The recipe: LeNet on the subset, 3000 images at global batch 128
// (23 steps an epoch), in 16 micro-shards of 8.
const std::string kRecipe = std::string("--model lenet --data-dir ") + DDP_DATA_DIR +
                            " --batch-size 128 --lr 0.05 --momentum 0.9 --seed 3 --deterministic --quiet";

class DeterministicFlags : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

// The runs that must agree to the bit, on the CPU's ranks, and on NCCL ranks
// sharing one GPU (skipped without one): the GPU path's all-reduce is NCCL's,
// and its sums are exact too.
class Deterministic : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const std::string why = on_.unfit(); !why.empty()) GTEST_SKIP() << why;
    dir_ = make_temp_dir();
  }
  void TearDown() override {
    if (!dir_.empty()) remove_tree(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  RunResult run(int np, const std::string& args) const { return run_ddp_train(np, args + on_.flags, on_.wrapper); }
  const RanksOn on_ = ranks_on(GetParam());
  std::string dir_;
};

// Each epoch's steps computed again (metrics' redone_steps), as every rank
// decides alike.
std::vector<int64_t> redone_steps(const std::string& metrics) {
  std::vector<int64_t> out;
  for (const std::string& line : lines_of(read_text(metrics)))
    out.push_back(nlohmann::json::parse(line).at("redone_steps").get<int64_t>());
  return out;
}

TEST_P(Deterministic, LeNetIsBitwiseTheSameAtOneTwoAndFourRanks) {
  nlohmann::json first;
  std::vector<int64_t> first_redone;
  for (int np : {1, 2, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    const std::string out = path("np" + std::to_string(np));
    auto r = run(np, kRecipe + " --epochs 12 --output-model " + out + " --metrics-out " + out + ".jsonl");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("deterministic: 16 micro-shards of 8 samples per step"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("bitwise the same at world sizes 1, 2, 4, 8 and 16"), std::string::npos) << r.out;
    const nlohmann::json s = summary_of(r);
    ASSERT_FALSE(s.is_null()) << r.out;
    // It learns (the d2l recipe reaches ~0.72 here in 12 epochs)...
    EXPECT_GT(s["test_acc"].get<double>(), 0.6);
    const std::vector<int64_t> redone = redone_steps(out + ".jsonl");
    ASSERT_EQ(redone.size(), 12u);
    if (np == 1) {
      first = s;
      first_redone = redone;
      continue;
    }
    // ...the same parameters to the bit, the same loss, the same steps redone.
    expect_bitwise_equal(checkpoint::read_safetensors(path("np1")), checkpoint::read_safetensors(out));
    EXPECT_EQ(redone, first_redone);
    EXPECT_EQ(s["train_loss"].get<double>(), first["train_loss"].get<double>());
    EXPECT_EQ(s["train_acc"].get<double>(), first["train_acc"].get<double>());
  }
}

// ResNet-18 with SyncBatchNorm: its statistics over the global batch, every
// rank's micro-shards summed in shard order (Note [micro-shards],
// deterministic/shards.hpp). A short run: 2 epochs of 3 steps, 8 micro-shards of 4; the
// -np 2 run's checkpoint after step 4 (mid-epoch) resumed at -np 4.
TEST_P(Deterministic, ResNet18WithSyncBatchNormIsBitwiseTheSameAtOneTwoAndFourRanksAndAcrossAResume) {
  const std::string args = std::string("--model resnet18 --data-dir ") + DDP_DATA_DIR +
                           " --batch-size 32 --lr 0.05 --momentum 0.9 --seed 3 --deterministic "
                           "--deterministic-shards 8 --sync-bn --train-limit 96 --epochs 2 --quiet";
  nlohmann::json first;
  for (int np : {1, 2, 4}) {
    SCOPED_TRACE("np " + std::to_string(np));
    const std::string out = path("np" + std::to_string(np));
    const std::string ck = np == 2 ? " --checkpoint-dir " + path("ck") + " --checkpoint-every 2" : "";
    auto r = run(np, args + ck + " --output-model " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("deterministic: 8 micro-shards of 4 samples per step"), std::string::npos) << r.out;
    const nlohmann::json s = summary_of(r);
    ASSERT_FALSE(s.is_null()) << r.out;
    const auto model = checkpoint::read_safetensors(out);
    // Every step moved the running statistics once.
    const auto* tracked = model.find("resnet_block4.1.bn2.num_batches_tracked");
    ASSERT_NE(tracked, nullptr);
    EXPECT_EQ(tracked->ints, std::vector<int64_t>{6});
    if (np == 1) {
      first = s;
      continue;
    }
    // Parameters, running statistics and counters to the bit, and the same
    // loss and accuracy.
    expect_bitwise_equal(checkpoint::read_safetensors(path("np1")), model);
    EXPECT_EQ(s["train_loss"].get<double>(), first["train_loss"].get<double>());
    EXPECT_EQ(s["test_acc"].get<double>(), first["test_acc"].get<double>());
  }
  const std::string from = path("ck") + "/" + checkpoint::checkpoint_file_name(4);
  ASSERT_TRUE(fs::exists(from));
  auto r = run(4, args + " --checkpoint-dir " + path("ck4") + " --resume " + from + " --output-model " +
                                path("resumed"));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_bitwise_equal(checkpoint::read_safetensors(path("np1")), checkpoint::read_safetensors(path("resumed")));
}

// On GPUs only: the pieces of --gpu-kernels next (BatchNorm's
// split sums, all micro-shards' in one launch, one rank's micro-shard sums
// added on the device, cuDNN's graph API, micro-shards in one checked call,
// their gradients taken together) keep the promise, in both layouts (NCHW,
// and NHWC activations with --channels-last).
class DeterministicNext : public Deterministic {};

TEST_P(DeterministicNext, ResNet18IsBitwiseTheSameAtOneTwoAndFourRanksInBothLayouts) {
  for (const std::string layout : {"", " --channels-last"}) {
    const std::string args = std::string("--model resnet18 --data-dir ") + DDP_DATA_DIR +
                             " --batch-size 32 --lr 0.05 --momentum 0.9 --seed 3 --deterministic "
                             "--deterministic-shards 8 --sync-bn --train-limit 96 --epochs 1 --quiet"
                             " --gpu-kernels next" + layout;
    const std::string tag = layout.empty() ? "nchw" : "nhwc";
    for (int np : {1, 2, 4}) {
      SCOPED_TRACE(tag + ", np " + std::to_string(np));
      auto r = run(np, args + " --output-model " + path(tag + std::to_string(np)));
      ASSERT_EQ(r.status, 0) << r.err;
      if (np > 1)
        expect_bitwise_equal(checkpoint::read_safetensors(path(tag + "1")),
                             checkpoint::read_safetensors(path(tag + std::to_string(np))));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(On, DeterministicNext, ::testing::Values("nccl_on_one_gpu"),
                         [](const auto& info) { return info.param; });

TEST_F(DeterministicFlags, BatchNormWithoutSyncBatchNormIsRefused) {
  auto r = run_ddp_train(2, std::string("--model resnet18 --data-dir ") + DDP_DATA_DIR +
                                " --batch-size 32 --deterministic --epochs 1 --quiet");
  expect_failure(r, "--deterministic: model resnet18 has BatchNorm, whose statistics over each rank's own batch "
                    "depend on the world size; add --sync-bn to take them over the global batch");
}

TEST_P(Deterministic, KilledAtFourRanksResumesAtTwoBitwiseAsOneRankRan) {
  auto ref = run(1, kRecipe + " --epochs 4 --output-model " + path("reference"));
  ASSERT_EQ(ref.status, 0) << ref.err;
  const std::string ck = path("ck");
  const std::string args = kRecipe + " --epochs 4 --checkpoint-dir " + ck + " --checkpoint-every 5";
  {
    BackgroundJob job(4, args + on_.flags + " --output-model " + path("killed"), on_.wrapper);
    // Well into epoch 2, then the whole job (launcher and ranks) dies.
    ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(ck) >= 30; }, 120));
    job.kill_all();
    job.wait();
  }
  ASSERT_FALSE(fs::exists(path("killed"))) << "the job finished before it was killed";
  const int64_t at = newest_checkpoint_step(ck);
  ASSERT_GT(at, 0);
  ASSERT_NE(at % 23, 0) << "the checkpoint resumed from should be mid-epoch";
  auto r = run(2, args + " --resume auto --output-model " + path("resumed"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(checkpoint::checkpoint_file_name(at)), std::string::npos) << r.out;
  expect_bitwise_equal(checkpoint::read_safetensors(path("reference")), checkpoint::read_safetensors(path("resumed")));
}

INSTANTIATE_TEST_SUITE_P(On, Deterministic, ::testing::Values("cpu", "nccl_on_one_gpu"),
                         [](const auto& info) { return info.param; });

TEST_F(DeterministicFlags, AWorldSizeThatCannotShareTheShardsIsRefusedWithTheOnesThatCan) {
  auto r = run_ddp_train(3, kRecipe + " --epochs 1 --batch-size 96 --deterministic-shards 8");
  expect_failure(r, "3 ranks cannot share 8 micro-shards (--deterministic-shards) evenly; the world sizes that "
                    "reproduce this run are 1, 2, 4 and 8");
}

TEST_F(DeterministicFlags, ShardsThatDoNotDivideTheBatchAreRefused) {
  auto r = run_ddp_train(1, kRecipe + " --epochs 1 --deterministic-shards 5");
  expect_failure(r, "--deterministic-shards 5 must divide the global batch (--batch-size 128)");
}

// A count below 1 is refused, not read as --deterministic off.
TEST_F(DeterministicFlags, NoShardsAreRefused) {
  for (const char* k : {"0", "-4"})
    expect_failure(run_ddp_train(1, kRecipe + " --epochs 1 --deterministic-shards " + k),
                   std::string("--deterministic-shards ") + k + " is out of range: it must be from 1 to 1048576");
}

// Timed algorithms differ between runs and ranks, so their bits would too.
TEST_F(DeterministicFlags, TimedConvolutionAlgorithmsAreRefused) {
  expect_failure(run_ddp_train(1, kRecipe + " --epochs 1 --cudnn-benchmark"),
                 "--cudnn-benchmark chooses convolution algorithms by timing them, which differs from run to run and "
                 "rank to rank: --deterministic needs the same algorithms everywhere; drop one of the two");
}

TEST_F(DeterministicFlags, ACheckpointOfAnotherCutIsRefusedNamingIt) {
  const std::string ck = path("ck");
  auto first = run_ddp_train(2, kRecipe + " --epochs 1 --checkpoint-dir " + ck);
  ASSERT_EQ(first.status, 0) << first.err;
  auto r = run_ddp_train(2, kRecipe + " --epochs 2 --deterministic-shards 32 --checkpoint-dir " + ck +
                                " --resume " + ck + "/" + checkpoint::checkpoint_file_name(23));
  expect_failure(r, "deterministic_shards differs: the checkpoint has 16, this run has 32");
}

}  // namespace
}  // namespace ddp::test
