// What a PyTorch DDP user trains with, end to end: AdamW, schedules,
// gradient accumulation without sync, clipping, and their state across a
// kill and --resume.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kData = std::string(" --data-dir ") + DDP_DATA_DIR;

// The buckets the start-up line announces: "(129068 parameters, 5 buckets)".
std::pair<long, long> params_and_buckets(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(\((\d+) parameters, (\d+) buckets?\))"))) return {-1, -1};
  return {std::stol(m[1]), std::stol(m[2])};
}

// d2l's recipe (lr 0.2, global batch 256) for one epoch, 11 optimizer steps:
// 4 micro-batches of 32 per rank sum to the gradient of the 128 samples
// each rank takes in one. Only the order of the float sums differs, which
// training amplifies from step to step (measured at -np 2: 8e-8 after one
// epoch, 3e-5 after three).
TEST(Accumulate, EndsWithTheParametersOfOneBigBatch) {
  const std::string recipe = kData + " --epochs 1 --quiet";
  EXPECT_LE(models_differ(2, recipe, 2, recipe + " --accumulate 4"), 1e-5);
  // The same samples per step as 8 ranks would take: here one rank in 8 parts.
  EXPECT_LE(models_differ(2, recipe, 1, recipe + " --accumulate 8"), 1e-5);
}

// no_sync: micro-batches 1..N-1 launch no all-reduce, the last launches every
// bucket once, so a step all-reduces what it does without accumulation.
TEST(Accumulate, OnlyTheLastMicroBatchAllReduces) {
  for (int acc : {1, 4}) {
    SCOPED_TRACE("--accumulate " + std::to_string(acc));
    auto r = run_ddp_train(2, "--synthetic 1024 --epochs 2 --batch-size 128 --bucket-cap-mb 0.1 --quiet --accumulate " +
                                  std::to_string(acc));
    ASSERT_EQ(r.status, 0) << r.err;
    const long buckets = params_and_buckets(r.out).second;
    ASSERT_GT(buckets, 2) << r.out;
    const json s = summary_of(r);
    EXPECT_EQ(s["allreduces_per_step"].get<double>(), double(buckets));
    EXPECT_EQ(s["allreduce_bytes_per_step"].get<double>(), 4.0 * allreduced_floats("lenet"));
    EXPECT_EQ(s["accumulate"], acc);
    if (acc > 1) {
      EXPECT_NE(r.out.find("4 micro-batches of 16 per rank per step"), std::string::npos) << r.out;
    }
  }
}

TEST(Accumulate, ThatDoesNotDivideTheRanksBatchIsRefused) {
  expect_failure(run_ddp_train(2, "--synthetic 512 --batch-size 64 --accumulate 3"),
                 "--accumulate 3 must divide the 32 samples each rank takes per step (--batch-size 64 over 2 ranks)");
}

TEST(Optimizers, AdamWWithCosineScheduleLearns) {
  // The subset, 6 epochs: AdamW at PyTorch's defaults but the rate.
  auto r = run_ddp_train(2, kData + " --epochs 6 --optimizer adamw --lr 0.003 --lr-schedule cosine --warmup-steps 6");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("optimizer adamw (betas 0.9, 0.999, eps 1e-08, weight decay 0.01)"), std::string::npos)
      << r.out;
  EXPECT_GE(summary_of(r)["test_acc"].get<double>(), 0.65) << r.out;
}

TEST(Optimizers, FlagsOfTheOtherOptimizerAreRefused) {
  expect_failure(run_ddp_train(2, "--optimizer adamw --momentum 0.9"), "--momentum and --nesterov are SGD's");
  expect_failure(run_ddp_train(2, "--betas 0.9,0.99"), "--betas and --eps are AdamW's; add --optimizer adamw");
  expect_failure(run_ddp_train(2, "--optimizer adam"), "--optimizer must be sgd or adamw, got 'adam'");
  expect_failure(run_ddp_train(2, "--optimizer adamw --betas 0.9"), "--betas: '0.9' is not two numbers");
  expect_failure(run_ddp_train(2, "--lr-step-size 5"), "--lr-step-size is for --lr-schedule step");
  expect_failure(run_ddp_train(2, "--lr-schedule step"), "--lr-schedule step needs --lr-step-size");
  expect_failure(run_ddp_train(2, "--synthetic 512 --batch-size 64 --epochs 1 --lr-schedule cosine --warmup-steps 8"),
                 "--warmup-steps 8 leaves no steps for the cosine: the run has 8 steps");
}

// The rate of each epoch's last step, as the schedule's formula gives it;
// --scale-lr multiplies the base by global batch / 256 and says so.
TEST(LrSchedules, EpochsReportTheRateTheScheduleGives) {
  const std::string dir = make_temp_dir();
  // 512 images, global batch 128: 4 steps an epoch, 12 in all.
  auto r = run_ddp_train(2, "--synthetic 512 --batch-size 128 --epochs 3 --lr 0.4 --scale-lr --lr-schedule step "
                            "--lr-step-size 3 --lr-gamma 0.5 --warmup-steps 2 --metrics-out " +
                                dir + "/m.jsonl");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("(--scale-lr: 0.4 x global batch 128 / 256)"), std::string::npos) << r.out;
  const auto lines = lines_of(read_text(dir + "/m.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  // Base 0.2; steps 3, 7, 11 are 1, 5, 9 after the warm-up: 0.2, 0.2 * 0.5, 0.2 * 0.125.
  const double want[] = {0.2, 0.1, 0.025};
  for (size_t e = 0; e < 3; ++e) EXPECT_NEAR(json::parse(lines[e])["lr"].get<double>(), want[e], 1e-12) << e;
  remove_tree(dir);
}

// LeNet on the subset at -np 2 with `flags`, seeds 0 and 1: the mean test
// accuracy of their last 8 of 16 epochs. A recipe with momentum (batch 64,
// lr 0.1, momentum 0.9) reaches in 16 epochs what d2l's plain SGD reaches in
// 80 (D2lRecipe): 0.77, measured with OpenBLAS's Haswell and Sandybridge
// kernels alike.
double lenet_accuracy(const std::string& flags, const std::function<void(const json&)>& check) {
  return last_epochs_accuracy(2, kData + " --batch-size 64 --lr 0.1 --momentum 0.9 " + flags, 16, 8, {0, 1}, check);
}

// --grad-compression: half the bytes per step, and LeNet learns as in fp32
// (lenet_accuracy). Measured at -np 2: fp32 0.771, bf16 0.778, fp16 0.776.
// The bound has room for other CPUs' rounding.
TEST(GradCompression, HalvesTheBytesAndLearnsAsFp32) {
  std::map<std::string, double> acc;
  for (const std::string c : {"none", "bf16", "fp16"})
    acc[c] = lenet_accuracy("--grad-compression " + c, [&](const json& s) {
      EXPECT_EQ(s["grad_compression"], c);
      EXPECT_EQ(s["allreduce_bytes_per_step"].get<double>(), (c == "none" ? 4.0 : 2.0) * allreduced_floats("lenet"))
          << c;
    });
  std::printf("mean test accuracy, last 8 epochs, 2 seeds: none %.4f, bf16 %.4f, fp16 %.4f\n", acc["none"],
              acc["bf16"], acc["fp16"]);
  EXPECT_GE(acc["none"], 0.72);
  EXPECT_NEAR(acc["bf16"], acc["none"], 0.02);
  EXPECT_NEAR(acc["fp16"], acc["none"], 0.02);
}

TEST(GradCompression, UnknownFormatIsRefused) {
  expect_failure(run_ddp_train(2, "--grad-compression int8"), "--grad-compression must be none, fp16 or bf16, got 'int8'");
}

// --precision bf16 and fp16 (on CPUs, rounded as autocast rounds: Note
// [mixed precision]) learn as fp32 does (lenet_accuracy). Measured at -np 2:
// fp32 0.771, bf16 0.767, fp16 0.770. The bound has room for other CPUs'
// rounding.
TEST(Precision, Bf16AndFp16LearnAsFp32) {
  std::map<std::string, double> acc;
  for (const std::string p : {"fp32", "bf16", "fp16"})
    acc[p] = lenet_accuracy("--precision " + p, [&](const json& s) { EXPECT_EQ(s["precision"], p); });
  std::printf("mean test accuracy, last 8 epochs, 2 seeds: fp32 %.4f, bf16 %.4f, fp16 %.4f\n", acc["fp32"],
              acc["bf16"], acc["fp16"]);
  EXPECT_GE(acc["fp32"], 0.72);
  EXPECT_NEAR(acc["bf16"], acc["fp32"], 0.02);
  EXPECT_NEAR(acc["fp16"], acc["fp32"], 0.02);
}

class OptimizerResume : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Runs `args` (checkpointing into path("ck"), --resume auto) until it has
  // saved global step `at`, kills it, checks its newest checkpoint holds
  // `names`, reruns it to the end and compares its final model with
  // path("ref"), bit for bit.
  void kill_and_resume(const std::string& args, int64_t at, std::initializer_list<const char*> names) {
    const std::string run = args + " --output-model " + path("resumed");
    {
      BackgroundJob job(2, run);
      ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(path("ck")) >= at; }, 120));
      job.kill_all();
      job.wait();
    }
    ASSERT_FALSE(fs::exists(path("resumed"))) << "the job finished before it was killed";
    const auto ck = checkpoint::read_safetensors(checkpoint::list_checkpoints(path("ck"))[0]);
    for (const char* name : names) EXPECT_NE(ck.find(name), nullptr) << name;
    auto r = run_ddp_train(2, run);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
    expect_bitwise_equal(checkpoint::read_safetensors(path("ref")), checkpoint::read_safetensors(path("resumed")));
  }
  std::string dir_;
};

// AdamW's moments and step count, the schedule's position, accumulation and
// clipping: a job killed mid-epoch and resumed ends bit for bit where an
// uninterrupted one does.
TEST_F(OptimizerResume, KilledJobWithEveryFeatureOnResumesBitwise) {
  const std::string recipe =
      "--synthetic 1200 --batch-size 64 --seed 3 --quiet --epochs 6 --optimizer adamw --lr 0.003 "
      "--no-decay-norm-bias --lr-schedule cosine --warmup-steps 10 --accumulate 2 --clip-grad-norm 0.5";
  auto ref = run_ddp_train(2, recipe + " --output-model " + path("ref"));
  ASSERT_EQ(ref.status, 0) << ref.err;
  kill_and_resume(recipe + " --checkpoint-dir " + path("ck") + " --checkpoint-every 5 --resume auto ", 25,
                  {"optimizer.step", "optimizer.exp_avg.fc2.weight", "optimizer.exp_avg_sq.conv1.bias"});
}

TEST_F(OptimizerResume, AnotherOptimizerIsRefusedNamingBoth) {
  const std::string base = "--synthetic 512 --batch-size 64 --epochs 1 --checkpoint-dir " + path("ck");
  ASSERT_EQ(run_ddp_train(2, base + " --momentum 0.9").status, 0);
  expect_failure(run_ddp_train(2, base + " --epochs 2 --resume auto --optimizer adamw --lr 0.001"),
                 "optimizer differs: the checkpoint has sgd, this run has adamw");
  EXPECT_EQ(checkpoint::list_checkpoints(path("ck")).size(), 1u);  // nothing saved was lost
}

// --precision fp16: the loss scaler's scale and count cross the checkpoint.
// The first scale, 2^40, overflows and halves for many steps; a growth
// interval of 3 then doubles it into overflows again, so the scale moves
// up and down across the kill.
TEST_F(OptimizerResume, KilledFp16JobResumesBitwiseWithItsLossScale) {
  const std::string recipe =
      "--synthetic 1200 --batch-size 64 --seed 3 --quiet --epochs 6 --momentum 0.9 --lr 0.05 --precision fp16 "
      "--init-scale 1099511627776 --growth-interval 3 --metrics-out ";
  auto ref = run_ddp_train(2, recipe + path("ref.jsonl") + " --output-model " + path("ref"));
  ASSERT_EQ(ref.status, 0) << ref.err;
  std::ifstream metrics(path("ref.jsonl"));
  std::string first_epoch;
  std::getline(metrics, first_epoch);
  const auto e = nlohmann::json::parse(first_epoch);
  EXPECT_GE(e.at("skipped_steps").get<int>(), 10) << first_epoch;
  EXPECT_LT(e.at("loss_scale").get<double>(), 1099511627776.0) << first_epoch;
  kill_and_resume(recipe + path("resumed.jsonl") + " --checkpoint-dir " + path("ck") +
                      " --checkpoint-every 5 --resume auto ",
                  30, {"scaler.scale", "scaler._growth_tracker"});
}

TEST_F(OptimizerResume, AnotherPrecisionIsRefusedNamingBoth) {
  const std::string base = "--synthetic 512 --batch-size 64 --epochs 1 --checkpoint-dir " + path("ck");
  ASSERT_EQ(run_ddp_train(2, base + " --precision fp16").status, 0);
  expect_failure(run_ddp_train(2, base + " --epochs 2 --resume auto"),
                 "precision differs: the checkpoint has fp16, this run has fp32");
  expect_failure(run_ddp_train(2, base + " --epochs 2 --resume auto --precision bf16"),
                 "precision differs: the checkpoint has fp16, this run has bf16");
  EXPECT_EQ(checkpoint::list_checkpoints(path("ck")).size(), 1u);  // nothing saved was lost
}

// Note [tf32]: on CPUs --precision tf32 is fp32, bit for bit, and says so.
TEST(Precision, Tf32OnTheCpuIsFp32AndSaysSo) {
  const std::string dir = make_temp_dir();
  const std::string args = kData + " --epochs 1 --seed 4 --output-model " + dir;
  const auto tf32 = run_ddp_train(1, args + "/tf32.safetensors --precision tf32");
  ASSERT_EQ(tf32.status, 0) << tf32.err;
  EXPECT_NE(tf32.out.find("ddp_train: precision tf32: convolutions and linear layers multiply on TF32 tensor cores"),
            std::string::npos)
      << tf32.out;
  EXPECT_NE(tf32.out.find("; CPUs have no TF32: fp32 there"), std::string::npos) << tf32.out;
  const auto fp32 = run_ddp_train(1, args + "/fp32.safetensors");
  ASSERT_EQ(fp32.status, 0) << fp32.err;
  expect_bitwise_equal(checkpoint::read_safetensors(dir + "/fp32.safetensors"),
                       checkpoint::read_safetensors(dir + "/tf32.safetensors"));
  remove_tree(dir);
}

TEST(Precision, LossScalerFlagsNeedFp16) {
  expect_failure(run_ddp_train(1, "--precision bf16 --init-scale 1024"),
                 "--init-scale and --growth-interval set --precision fp16's loss scaler; add --precision fp16");
  expect_failure(run_ddp_train(1, "--precision fp16 --growth-interval 0"), "--growth-interval 0 is out of range");
  expect_failure(run_ddp_train(1, "--precision fp8"), "--precision must be fp32, tf32, bf16 or fp16, got 'fp8'");
}

}  // namespace
}  // namespace ddp::test
