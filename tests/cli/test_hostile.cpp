// Hostile inputs at -np 4, as a user who means harm (or is unlucky) meets
// them: each ends in one clear error naming the file, flag or rank, a
// non-zero exit within 30 s and no process left (expect_failure), and
// nothing already saved is lost. (Malformed checkpoints: BadCheckpoint.* in
// test_checkpoint.cpp; the readers themselves: tests/unit.)
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "../unit/data/test_util.hpp"  // IDX files byte by byte, write_gzip_with_zeros
#include "ddp/checkpoint/checkpoint.hpp"
#include "run_outputs.hpp"

namespace ddp::test {
namespace {

namespace fs = std::filesystem;
using data::testing::write_raw;

constexpr int kNp = 4;
const std::string kSmall = "--synthetic 1200 --batch-size 64 --quiet";

// The real subset copied into a fresh directory, to be spoiled.
class Hostile : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  void TearDown() override { remove_tree(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string copy_data() const {
    fs::create_directories(path("data"));
    for (const auto& e : fs::directory_iterator(DDP_DATA_DIR))
      if (e.path().extension() == ".gz") fs::copy_file(e.path(), path("data/" + e.path().filename().string()));
    return path("data");
  }
  std::string dir_;
};

// 1. A train-images file whose header declares 10 images but whose gzip
// stream inflates to a gigabyte: each rank reads the header's worth and stops.
TEST_F(Hostile, GzipBomb) {
  const std::string data = copy_data();
  const std::string bomb = data + "/train-images-idx3-ubyte.gz";
  std::vector<uint8_t> header = data::testing::idx_images(10, 28, 28);
  header.resize(16);
  data::testing::write_gzip_with_zeros(bomb, header, uint64_t(1) << 30);
  expect_failure(run_ddp_train(kNp, "--data-dir " + data + " --epochs 1"),
                 bomb + ": more than 16777216 extra bytes after the 7840 bytes of pixel data the header announces");
}

// 2. Bytes after the gzip data: garbage is refused; another gzip member is
// read on, and its bytes count against the header.
TEST_F(Hostile, DataAfterTheGzipStream) {
  const std::string data = copy_data();
  const std::string labels = data + "/t10k-labels-idx1-ubyte.gz";
  std::ofstream(labels, std::ios::binary | std::ios::app) << "trailing garbage";
  expect_failure(run_ddp_train(kNp, "--data-dir " + data + " --epochs 1"),
                 labels + ": 16 bytes after the end of the gzip data are not gzip data");
  fs::copy_file(std::string(DDP_DATA_DIR) + "/t10k-labels-idx1-ubyte.gz", labels,
                fs::copy_options::overwrite_existing);
  const std::vector<uint8_t> member = data::testing::gzip({1, 2, 3});
  std::ofstream(labels, std::ios::binary | std::ios::app)
      .write(reinterpret_cast<const char*>(member.data()), std::streamsize(member.size()));
  expect_failure(run_ddp_train(kNp, "--data-dir " + data + " --epochs 1"),
                 labels + ": 3 extra bytes after the 594 bytes of label data the header announces");
}

// 3. A diverging run ends naming the step, and no checkpoint of the diverged
// state is written: every checkpoint left is finite and loads.
TEST_F(Hostile, DivergingRunStopsBeforeSavingIt) {
  const std::string ck = path("ck");
  auto r = run_ddp_train(kNp, kSmall + " --epochs 3 --lr 1e9 --checkpoint-dir " + ck +
                                  " --checkpoint-every 1 --keep-checkpoints 2");
  expect_failure(r, "training diverged at epoch 1, step ");
  EXPECT_NE(r.err.find("the averaged gradients hold a NaN or an infinity"), std::string::npos) << r.err;
  const auto left = checkpoint::list_checkpoints(ck);
  ASSERT_FALSE(left.empty()) << "the steps before the divergence were checkpointed";
  for (const auto& f : left) EXPECT_NO_THROW(checkpoint::decode_checkpoint(f, checkpoint::read_file_bytes(f))) << f;
}

// 4. Timeouts outside [1 ms, 1 year] are refused at start, naming flag, value
// and range (1e16 s used to overflow the millisecond count; 1e-9 s became 0).
TEST_F(Hostile, TimeoutsOutOfRange) {
  for (const std::string v : {"1e16", "1e300", "1e-9", "inf"}) {
    SCOPED_TRACE(v);
    expect_failure(run_ddp_train(kNp, kSmall + " --epochs 1 --timeout " + v),
                   "is out of range: it must be from 0.001 to 31536000 seconds");
  }
  expect_failure(run_ddp_train(kNp, kSmall + " --epochs 1 --preflight-timeout 1e16"),
                 "--preflight-timeout 1e+16 is out of range");
}

// 5. --resume naming a directory; and a directory named like a checkpoint is
// not one to --resume auto.
TEST_F(Hostile, ResumeFromADirectory) {
  expect_failure(run_ddp_train(kNp, kSmall + " --epochs 1 --resume " + dir_),
                 "--resume " + dir_ + ": is a directory, not a checkpoint file");
  const std::string ck = path("ck");
  fs::create_directories(ck + "/" + checkpoint::checkpoint_file_name(99));
  auto r = run_ddp_train(kNp, kSmall + " --epochs 1 --checkpoint-dir " + ck + " --resume auto");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("starting fresh"), std::string::npos) << r.out;
}

// 6, 7. Where a run will write is checked before any data is read (the data
// directory here does not exist, and is not what the error is about).
TEST_F(Hostile, UnwritableOutputsAreRefusedBeforeTraining) {
  const std::string no_data = " --epochs 1 --data-dir " + path("no-data");
  const std::string file = path("file");
  std::ofstream(file) << "x";
  expect_failure(run_ddp_train(kNp, "--checkpoint-dir " + file + no_data),
                 "--checkpoint-dir " + file + ": exists and is not a directory");
  expect_failure(run_ddp_train(kNp, "--checkpoint-dir " + file + "/ck" + no_data),
                 "--checkpoint-dir " + file + "/ck: cannot create the directory");
  expect_failure(run_ddp_train(kNp, "--checkpoint-dir /sys" + no_data),
                 "--checkpoint-dir /sys: cannot write in the directory");
  expect_failure(run_ddp_train(kNp, "--output-model " + path("missing/model.safetensors") + no_data),
                 "--output-model " + path("missing/model.safetensors") + ": its directory " + path("missing") +
                     ": no such directory");
  expect_failure(run_ddp_train(kNp, "--output-model " + dir_ + no_data),
                 "--output-model " + dir_ + ": is a directory, not a file name");
  expect_failure(run_ddp_train(kNp, "--metrics-out " + path("missing/m.jsonl") + no_data),
                 "--metrics-out " + path("missing/m.jsonl") + ": its directory");
}

// 12. A checkpoint that does not fit (a full disk: a 1.2 MiB tmpfs, where the
// third of LeNet's 0.5 MiB checkpoints cannot be written) ends the job naming
// the directory and its free space; the two before it are untouched, no
// temporary file is left, and a run resumes from the newest. Needs root and
// mount(2); skipped where a tmpfs cannot be mounted.
TEST_F(Hostile, FullDiskEndsTheJobAndKeepsEarlierCheckpoints) {
  const std::string ck = path("small-disk");
  fs::create_directories(ck);
  if (std::system(("mount -t tmpfs -o size=1200k tmpfs " + ck + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root and mount(2))";
  struct Unmount {
    std::string dir;
    ~Unmount() { std::system(("umount " + dir).c_str()); }
  } unmount{ck};
  // 1024 images at batch 128: 8 steps an epoch, a checkpoint at steps 8, 16, 24.
  const std::string args = "--synthetic 1024 --batch-size 128 --quiet --checkpoint-dir " + ck;
  auto r = run_ddp_train(kNp, args + " --epochs 3");
  expect_failure(r, "cannot write the checkpoint of global step 24 into " + ck + " (--checkpoint-dir)");
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(ck + " has "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" MiB free of 1.2 MiB"), std::string::npos) << r.err;
  const auto left = checkpoint::list_checkpoints(ck);
  ASSERT_EQ(left.size(), 2u);
  for (const auto& f : left) EXPECT_NO_THROW(checkpoint::decode_checkpoint(f, checkpoint::read_file_bytes(f))) << f;
  EXPECT_EQ(newest_checkpoint_step(ck), 16);
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  // The newest is where a resumed run (of two epochs: nothing left to do)
  // starts from.
  auto resumed = run_ddp_train(kNp, args + " --epochs 2 --resume auto");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("ckpt-0000000016.safetensors"), std::string::npos) << resumed.out;
}

// 11. Two jobs given one --checkpoint-dir: the second is refused naming the
// directory and the first job's host and pid, and the first goes on
// undisturbed; a job killed outright does not block its own restart.
TEST_F(Hostile, TwoJobsInOneCheckpointDirectory) {
  const std::string ck = path("ck");
  const std::string args = kSmall + " --checkpoint-dir " + ck + " --keep-checkpoints 2";
  {
    BackgroundJob first(2, args + " --epochs 30 --output-model " + path("first.safetensors"));
    ASSERT_TRUE(wait_until([&] { return !checkpoint::list_checkpoints(ck).empty(); }, 120));
    auto second = run_ddp_train(kNp, args + " --epochs 30 --resume auto");
    expect_failure(second, "--checkpoint-dir " + ck + " is in use by another job (ddp_train pid ");
    EXPECT_NE(second.err.find(" on host "), std::string::npos) << second.err;
    const auto r = first.wait();
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::exists(path("first.safetensors")));
    const auto files = checkpoint::list_checkpoints(ck);
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(fs::path(files[0]).filename(), checkpoint::checkpoint_file_name(30 * 18));
  }
  {
    BackgroundJob killed(2, args + " --epochs 60 --resume auto");
    ASSERT_TRUE(wait_until([&] {
      const auto l = checkpoint::list_checkpoints(ck);
      return !l.empty() && l[0] != ck + "/" + checkpoint::checkpoint_file_name(30 * 18);
    }, 120));
    killed.kill_all();
    killed.wait();
  }
  auto again = run_ddp_train(kNp, args + " --epochs 60 --resume auto");
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.out.find("resuming from"), std::string::npos) << again.out;
}

// 12. A job restarted the moment its predecessor's launcher was SIGKILLed
// (a retry loop, a requeue) while that job's rank 0 still holds the
// directory: it waits for the orphaned rank, saying so, and resumes. The
// orphaned ranks end by themselves within a second or so; rank 0 is stopped
// as soon as the launcher is gone (not before: a process group orphaned with
// a stopped member gets SIGHUP) so that it surely outlives the new job's
// start, and ended once the new job waits.
TEST_F(Hostile, RestartAfterTheLauncherIsKilledWaitsForItsRanks) {
  const std::string ck = path("ck");
  const std::string args = kSmall + " --checkpoint-dir " + ck + " --epochs 60 --resume auto";
  BackgroundJob killed(2, args);
  ASSERT_TRUE(wait_until([&] { return !checkpoint::list_checkpoints(ck).empty(); }, 120));
  const int rank0 = killed.rank_pid(0);
  ASSERT_GT(rank0, 0);
  killed.signal_launcher(SIGKILL);
  ASSERT_TRUE(wait_until([&] { return !killed.running(); }, 10));
  ASSERT_EQ(::kill(rank0, SIGSTOP), 0);
  auto state = [&] {  // /proc/<pid>/stat's state letter, "" once gone
    const std::string stat = read_text("/proc/" + std::to_string(rank0) + "/stat");
    const size_t close = stat.rfind(')');
    return close == std::string::npos ? std::string() : stat.substr(close + 2, 1);
  };
  wait_until([&] { return state() != "R" && state() != "S"; }, 10);
  ASSERT_EQ(state(), "T") << "the old rank 0 ended before it could be held";
  BackgroundJob again(kNp, args + " --epochs 1");
  const std::string waiting = "ddp_train: --checkpoint-dir " + ck + " is held by ddp_train pid " +
                              std::to_string(rank0) + " on host ";
  EXPECT_TRUE(wait_until([&] { return again.err_so_far().find(waiting) != std::string::npos; }, 60))
      << again.err_so_far();
  EXPECT_NE(again.err_so_far().find("a rank of a job whose launcher is gone; waiting up to 20 s for it to end"),
            std::string::npos)
      << again.err_so_far();
  ::kill(rank0, SIGKILL);
  const auto r = again.wait();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resuming from"), std::string::npos) << r.out;
  killed.kill_all();
}

}  // namespace
}  // namespace ddp::test
