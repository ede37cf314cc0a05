// Checkpoints and resume as a user meets them: a job killed at any moment and
// rerun with --resume auto ends exactly where an uninterrupted one does.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;
using checkpoint::list_checkpoints;

// 1200 images at global batch 64: 18 steps per epoch. Momentum, so that the
// optimizer state must be restored too.
const std::string kRecipe = "--synthetic 1200 --batch-size 64 --lr 0.05 --momentum 0.9 --seed 3 --quiet";

checkpoint::SafetensorsFile model_file(const std::string& path) { return checkpoint::read_safetensors(path); }

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The uninterrupted run every interrupted one is compared with.
  checkpoint::SafetensorsFile reference(int np, int epochs) {
    const std::string out = path("reference_np" + std::to_string(np) + "_e" + std::to_string(epochs));
    if (!fs::exists(out)) {
      auto r = run_ddp_train(np, kRecipe + " --epochs " + std::to_string(epochs) + " --output-model " + out);
      EXPECT_EQ(r.status, 0) << r.err;
    }
    return model_file(out);
  }
  std::string dir_;
};

TEST_F(Checkpoint, KilledJobResumesBitwiseIdentical) {
  const auto ref = reference(2, 6);
  const std::string args = kRecipe + " --epochs 6 --checkpoint-dir " + path("ck") +
                           " --checkpoint-every 4 --resume auto --output-model " + path("resumed");
  {
    BackgroundJob job(2, args);
    // Kill the whole job (launcher and ranks) once it is well into epoch 2.
    ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(path("ck")) >= 28; }, 120));
    job.kill_all();
    job.wait();
  }
  ASSERT_FALSE(fs::exists(path("resumed"))) << "the job finished before it was killed";
  const int64_t at = newest_checkpoint_step(path("ck"));
  ASSERT_GT(at, 0);
  auto r = run_ddp_train(2, args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(checkpoint::checkpoint_file_name(at)), std::string::npos) << r.out;
  expect_bitwise_equal(ref, model_file(path("resumed")));
}

// The global-step property (Note [global step] in data/sampler.hpp): a mid-epoch checkpoint of a 4-rank run
// continues on 2 ranks (and back) with the same samples at every step.
TEST_F(Checkpoint, ResumesOnAnotherWorldSize) {
  for (auto [from, to] : {std::pair{4, 2}, std::pair{2, 4}}) {
    SCOPED_TRACE(std::to_string(from) + " -> " + std::to_string(to));
    const std::string ck = path("ck" + std::to_string(from));
    auto first = run_ddp_train(from, kRecipe + " --epochs 2 --checkpoint-dir " + ck +
                                         " --checkpoint-every 7 --keep-checkpoints 100");
    ASSERT_EQ(first.status, 0) << first.err;
    // Global step 28 is step 10 of epoch 2: mid-epoch.
    const std::string mid = ck + "/" + checkpoint::checkpoint_file_name(28);
    ASSERT_TRUE(fs::exists(mid));
    const std::string out = path("from" + std::to_string(from));
    auto r = run_ddp_train(to, kRecipe + " --epochs 3 --resume " + mid + " --output-model " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("epoch 2, step 10"), std::string::npos) << r.out;
    EXPECT_LE(max_rel_diff(reference(from, 3), model_file(out)), 1e-4);
  }
}

TEST_F(Checkpoint, RepeatedKillsNeverLeaveTheDirectoryWithoutALoadableCheckpoint) {
  const std::string args = kRecipe + " --epochs 5 --checkpoint-dir " + path("ck") +
                           " --checkpoint-every 1 --keep-checkpoints 2 --resume auto --output-model " +
                           path("final");
  int64_t last = -1;
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    BackgroundJob job(2, args);
    // A checkpoint every step: kill while rank 0 is writing the next ones.
    ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(path("ck")) >= last + 3 + round; }, 120));
    job.kill_all();
    job.wait();
    const auto files = list_checkpoints(path("ck"));
    ASSERT_FALSE(files.empty());
    // The newest file is always whole: a torn write never takes its name.
    const auto c = checkpoint::decode_checkpoint(files[0], checkpoint::read_file_bytes(files[0]));
    EXPECT_GT(c.state.global_step, last);
    last = c.state.global_step;
  }
  auto r = run_ddp_train(2, args);
  ASSERT_EQ(r.status, 0) << r.err;
  expect_bitwise_equal(reference(2, 5), model_file(path("final")));
}

// Open MPI's mpirun passes SIGTERM on to the ranks after
// odls_base_sigkill_timeout (1 s), and SIGKILLs them 1 s later: the run is
// long enough to still be training then, and the checkpoint is written in time.
TEST_F(Checkpoint, SigtermToMpirunCheckpointsAndResumesExactly) {
  const std::string args = kRecipe + " --epochs 20 --checkpoint-dir " + path("ck") +
                           " --resume auto --output-model " + path("resumed");
  RunResult stopped;
  {
    BackgroundJob job(2, args);
    // Once the first epoch's checkpoint exists, training is under way.
    ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(path("ck")) >= 18; }, 120));
    job.signal_launcher(SIGTERM);
    stopped = job.wait();
  }
  EXPECT_NE(stopped.out.find("stopped by signal 15"), std::string::npos) << stopped.out << stopped.err;
  ASSERT_FALSE(fs::exists(path("resumed"))) << "the job finished before the signal reached it";
  auto r = run_ddp_train(2, args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
  expect_bitwise_equal(reference(2, 20), model_file(path("resumed")));
}

TEST_F(Checkpoint, StoppedRankExitsWithTheDocumentedStatus) {
  // Without mpirun in between, the rank's own exit status is seen.
  const std::string args = kRecipe + " --epochs 50 --checkpoint-dir " + path("ck");
  BackgroundJob job(0, args);
  ASSERT_TRUE(wait_until([&] { return newest_checkpoint_step(path("ck")) >= 18; }, 120));
  job.signal_launcher(SIGTERM);
  const auto r = job.wait();
  EXPECT_EQ(r.status, 75) << r.out << r.err;
  EXPECT_GT(newest_checkpoint_step(path("ck")), 18);
}

class BadCheckpoint : public Checkpoint {
 protected:
  // Two valid checkpoints (steps 18 and 36) of a finished 2-epoch run.
  void SetUp() override {
    Checkpoint::SetUp();
    ck_ = path("ck");
    auto r = run_ddp_train(2, kRecipe + " --epochs 2 --checkpoint-dir " + ck_);
    ASSERT_EQ(r.status, 0) << r.err;
    newest_ = ck_ + "/" + checkpoint::checkpoint_file_name(36);
    older_ = ck_ + "/" + checkpoint::checkpoint_file_name(18);
    ASSERT_TRUE(fs::exists(newest_) && fs::exists(older_));
    bytes_ = checkpoint::read_file_bytes(newest_);
  }
  void replace_newest(const std::string& bytes) {
    std::ofstream(newest_, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  }
  // --resume FILE names the file and the problem; --resume auto warns and
  // falls back to the older checkpoint. Both at -np 4.
  void expect_rejected(const std::string& problem) {
    auto r = run_ddp_train(4, kRecipe + " --epochs 3 --resume " + newest_);
    expect_failure(r, problem);
    EXPECT_NE(r.err.find("ddp_train: error: " + newest_), std::string::npos) << r.err;
    auto a = run_ddp_train(4, kRecipe + " --epochs 3 --checkpoint-dir " + ck_ + " --resume auto");
    EXPECT_EQ(a.status, 0) << a.err;
    EXPECT_NE(a.err.find("warning: skipping checkpoint " + newest_), std::string::npos) << a.err;
    EXPECT_NE(a.err.find(problem), std::string::npos) << a.err;
    EXPECT_NE(a.out.find("resuming from " + older_), std::string::npos) << a.out;
  }
  // The newest checkpoint with its JSON header edited (the data bytes kept).
  void edit_header(const std::function<void(nlohmann::json&)>& edit) {
    uint64_t len = 0;
    std::memcpy(&len, bytes_.data(), 8);
    auto header = nlohmann::json::parse(bytes_.substr(8, len));
    edit(header);
    const std::string h = header.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
    replace_newest(out + h + bytes_.substr(8 + len));
  }
  // The newest checkpoint as first written, written again after `edit`, CRC
  // and all: what a checksum cannot catch.
  void rewrite(const std::function<void(checkpoint::Checkpoint&)>& edit) {
    auto c = checkpoint::decode_checkpoint(newest_, bytes_);
    edit(c);
    std::vector<checkpoint::TensorView> views;
    for (const auto& t : c.file.tensors)
      if (t.dtype == checkpoint::Dtype::I64)
        views.push_back({t.name, t.shape, nullptr, t.ints.data()});
      else
        views.push_back({t.name, t.shape, t.data.data()});
    replace_newest(checkpoint::encode_checkpoint(c.state, views));
  }
  std::string ck_, newest_, older_, bytes_;
};

TEST_F(BadCheckpoint, MetadataThatIsNotAnObject) {
  edit_header([](nlohmann::json& h) { h["__metadata__"] = "epoch=3"; });
  expect_rejected("__metadata__ is not a JSON object");
}

TEST_F(BadCheckpoint, MetadataValueOfTheWrongType) {
  edit_header([](nlohmann::json& h) { h["__metadata__"]["world_size"] = 2; });
  expect_rejected("metadata 'world_size' is not a string");
}

TEST_F(BadCheckpoint, ShapeThatMultipliesPastMemory) {
  edit_header([](nlohmann::json& h) { h["fc2.bias"]["shape"] = {uint64_t(1) << 40, uint64_t(1) << 40}; });
  expect_rejected("tensor 'fc2.bias': shape [1099511627776,1099511627776] does not match its 40 bytes");
}

TEST_F(BadCheckpoint, OverlappingDataOffsets) {
  edit_header([](nlohmann::json& h) {
    auto& off = h["fc2.bias"]["data_offsets"];
    off = {off[0].get<uint64_t>() - 4, off[1].get<uint64_t>() - 4};
  });
  expect_rejected("overlaps the tensor before it");
}

TEST_F(BadCheckpoint, NonFiniteWeights) {
  rewrite([](checkpoint::Checkpoint& c) { c.file.tensors[3].data[7] = std::nanf(""); });
  expect_rejected("holds a NaN or an infinity (element 7)");
}

TEST_F(BadCheckpoint, WorldSizeZero) {
  rewrite([](checkpoint::Checkpoint& c) { c.state.world_size = 0; });
  expect_rejected("'world_size' is 0");
}

// Positions that no run of this dataset and batch reaches, some large enough
// to overflow the trainer's counters if they were believed.
TEST_F(BadCheckpoint, GlobalStepThatDoesNotFollowFromItsEpoch) {
  rewrite([](checkpoint::Checkpoint& c) { c.state.global_step += 1; });
  expect_rejected("global step 37 is not epoch 2 x 18 steps + step 0");
}

TEST_F(BadCheckpoint, PositionThatWouldOverflowTheCounters) {
  rewrite([](checkpoint::Checkpoint& c) {
    c.state.epoch = int64_t(1) << 50;
    c.state.global_step = int64_t(1) << 50;
    c.state.samples_consumed = int64_t(1) << 50;
  });
  expect_rejected("is not epoch 1125899906842624 x 18 steps");
}

TEST_F(BadCheckpoint, StepNearTheInt64Limit) {
  rewrite([](checkpoint::Checkpoint& c) { c.state.global_step = std::numeric_limits<int64_t>::max(); });
  expect_rejected("metadata 'global_step' is not an integer from 0 to");
}

TEST_F(Checkpoint, IncompatibleGlobalBatchIsRefusedNamingTheField) {
  auto r = run_ddp_train(2, kRecipe + " --epochs 1 --checkpoint-dir " + path("ck"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string args = "--synthetic 1200 --batch-size 128 --lr 0.05 --momentum 0.9 --seed 3 --epochs 2";
  for (const std::string& resume : {list_checkpoints(path("ck"))[0], std::string("auto")}) {
    SCOPED_TRACE(resume);
    auto bad = run_ddp_train(4, args + " --checkpoint-dir " + path("ck") + " --resume " + resume);
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.err.find("global_batch differs: the checkpoint has 64, this run has 128"), std::string::npos)
        << bad.err;
  }
  // Nothing saved was lost.
  EXPECT_EQ(list_checkpoints(path("ck")).size(), 1u);
}

TEST_F(Checkpoint, ResumeAutoWithoutCheckpointsStartsFresh) {
  auto r = run_ddp_train(2, kRecipe + " --epochs 1 --checkpoint-dir " + path("empty") + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("starting fresh"), std::string::npos) << r.out;
  EXPECT_EQ(list_checkpoints(path("empty")).size(), 1u);
}

}  // namespace
}  // namespace ddp::test
