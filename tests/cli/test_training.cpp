// End-to-end training as a user runs it: the summary contract, the start-up
// table, metrics files, exact data parallelism, and learning on real data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "ddp/checkpoint/safetensors.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

using json = nlohmann::json;

// Not on a terminal (a pipe, as in a Slurm log): plain step lines, four an
// epoch by default or every --log-every steps, never a carriage return or
// an escape code; --quiet has none.
TEST(Training, ProgressOffATerminalIsPlainStepLines) {
  // 1536 images at global batch 128: 12 steps an epoch.
  const std::string args = "--synthetic 1536 --batch-size 128 --epochs 2";
  for (const auto& [extra, per_epoch] : {std::pair<std::string, int>{"", 3}, {" --log-every 5", 2}}) {
    SCOPED_TRACE(extra);
    auto r = run_ddp_train(2, args + extra);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
    for (int e = 1; e <= 2; ++e) {
      int lines = 0;
      for (const auto& l : lines_of(r.out))
        lines += l.rfind("step ", 0) == 0 && l.find("  epoch " + std::to_string(e) + "/2  loss ") != l.npos &&
                 l.find(" samples/s  elapsed ") != l.npos;
      EXPECT_EQ(lines, per_epoch) << "epoch " << e << ":\n" << r.out;
    }
  }
  auto q = run_ddp_train(2, args + " --quiet");
  ASSERT_EQ(q.status, 0) << q.err;
  EXPECT_EQ(q.out.find("step "), std::string::npos) << q.out;
}

TEST(Training, SummaryMetricsAndStartupTable) {
  const std::string dir = make_temp_dir();
  auto r = run_ddp_train(4, "--synthetic 2000 --epochs 3 --batch-size 128 --metrics-out " + dir + "/m.jsonl");
  ASSERT_EQ(r.status, 0) << r.err;
  // The last line of stdout is the summary.
  const auto lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  const json s = json::parse(lines.back());
  EXPECT_EQ(s["event"], "summary");
  for (const char* key : {"world_size", "epochs", "test_acc", "train_loss", "epoch_sec_median", "samples_per_sec"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_EQ(s["world_size"], 4);
  EXPECT_EQ(s["epochs"], 3);
  EXPECT_GT(s["samples_per_sec"].get<double>(), 0);
  // One line per epoch from rank 0 only.
  int epoch_lines = 0;
  for (const auto& l : lines) epoch_lines += l.rfind("epoch ", 0) == 0;
  EXPECT_EQ(epoch_lines, 3) << r.out;
  // The start-up table names every rank once.
  for (int rank = 0; rank < 4; ++rank) {
    const std::string row = " " + std::to_string(rank) + "  ";
    EXPECT_NE(r.out.find(row), std::string::npos) << "no table row for rank " << rank << ":\n" << r.out;
  }
  EXPECT_NE(r.out.find("steps per epoch"), std::string::npos);
  // --metrics-out: one JSON object per epoch, the last matching the summary.
  const auto mlines = lines_of(read_text(dir + "/m.jsonl"));
  ASSERT_EQ(mlines.size(), 3u);
  for (size_t i = 0; i < mlines.size(); ++i) EXPECT_EQ(json::parse(mlines[i])["epoch"], i + 1);
  EXPECT_DOUBLE_EQ(json::parse(mlines.back())["test_acc"].get<double>(), s["test_acc"].get<double>());
  remove_tree(dir);
}

// A recipe with margin: test accuracy 0.99-1.0 for seeds 0-5 with OpenBLAS's
// default and Haswell kernels, with and without core/simd.hpp's AVX-512 path,
// at np 2 (and 4, netns_two_hosts), so last-bit differences between CPUs
// cannot decide it.
TEST(Training, LearnsTheSyntheticDataset) {
  auto r = run_ddp_train(2, "--synthetic 3000 --epochs 4 --batch-size 32 --lr 0.03 --momentum 0.9 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  const json s = summary_of(r);
  ASSERT_FALSE(s.is_null()) << r.out;
  EXPECT_GE(s["test_acc"].get<double>(), 0.9) << r.out;
}

// The global-step property (Note [global step] in data/sampler.hpp): with the same global batch and seed, one
// rank and four ranks see the same samples at every step and average the same
// gradients, so they follow the same trajectory up to float summation order.
// That order differs (per-rank sums, then the all-reduce), and training
// amplifies the last bits (a ReLU that flips, the N(0, 0.01) plateau's exit),
// so the comparison is over one epoch (18 steps): 60 pairs there (seeds 0-9;
// OpenBLAS's default, Haswell and SkylakeX kernels; core/simd.hpp's AVX-512
// path on and compiled out) differed by 3e-7 to 9.3e-5. Another seed differs
// by ~1, other samples too, and a 0.1% larger learning rate by 7e-3, so 1e-3 tells
// a real difference from rounding with margin on both sides. (docs/deterministic.md,
// "Agreement across world sizes", has the longer horizons.)
TEST(Training, FourRanksEqualOneRank) {
  const std::string dir = make_temp_dir();
  const std::string args = " --synthetic 1200 --epochs 1 --batch-size 64 --lr 0.1 --momentum 0.9 --seed 7 --quiet";
  auto r1 = run_ddp_train(1, args + " --output-model " + dir + "/np1.safetensors");
  ASSERT_EQ(r1.status, 0) << r1.err;
  auto r4 = run_ddp_train(4, args + " --bucket-cap-mb 0.05 --output-model " + dir + "/np4.safetensors");
  ASSERT_EQ(r4.status, 0) << r4.err;
  const auto a = checkpoint::read_safetensors(dir + "/np1.safetensors");
  const auto b = checkpoint::read_safetensors(dir + "/np4.safetensors");
  ASSERT_FALSE(a.tensors.empty());
  EXPECT_LE(max_rel_diff(a, b), 1e-3);
  // And a different seed really gives different parameters: the check can fail.
  auto r5 = run_ddp_train(1, " --synthetic 1200 --epochs 1 --batch-size 64 --lr 0.1 --momentum 0.9 --seed 8 --quiet"
                             " --output-model " + dir + "/other.safetensors");
  ASSERT_EQ(r5.status, 0) << r5.err;
  EXPECT_GT(max_rel_diff(a, checkpoint::read_safetensors(dir + "/other.safetensors")), 1e-1);
  remove_tree(dir);
}

// One rank with every core: the GEMM threads share the work differently on
// every run, and the result must not depend on it (Note [deterministic sums]);
// resuming "to the bit" relies on this.
TEST(Training, OneRankWithSeveralThreadsRepeatsBitForBit) {
  const std::string args = "--synthetic 2000 --epochs 2 --batch-size 128 --quiet";
  EXPECT_EQ(models_differ(0, args, 0, args), 0.0);
}

TEST(Training, OverlapAndDeferredCommunicationAgree) {
  const std::string args = "--synthetic 1200 --epochs 1 --batch-size 64 --bucket-cap-mb 0.05 --quiet";
  EXPECT_EQ(models_differ(2, args, 2, args + " --no-overlap"), 0.0);
}

// d2l's recipe on real Fashion-MNIST images (the 3000-image subset needs more
// epochs than the full set to leave the plateau of the N(0, 0.01) start), at
// every world size the issue names. Plain SGD at lr 0.2 has margin: seeds 0-2
// at np 1, 2 and 4, with the default kernels and with OpenBLAS's Haswell ones
// and core/simd.hpp's AVX-512 path compiled out, ended at 0.75-0.79.
class D2lRecipe : public ::testing::TestWithParam<int> {};

TEST_P(D2lRecipe, LearnsRealFashionMnist) {
  auto r = run_ddp_train(GetParam(), std::string("--model lenet --data-dir ") + DDP_DATA_DIR +
                                         " --epochs 80 --batch-size 256 --lr 0.2 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  const json s = summary_of(r);
  ASSERT_FALSE(s.is_null()) << r.out;
  EXPECT_EQ(s["world_size"], GetParam());
  EXPECT_GE(s["test_acc"].get<double>(), 0.70) << r.out;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, D2lRecipe, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace ddp::test
