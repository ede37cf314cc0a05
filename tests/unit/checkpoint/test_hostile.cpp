// Checkpoints made to break the reader: each is refused with one error that
// names the file and what is wrong (never a bare library exception, never an
// allocation of what the file merely claims), and what the format does not
// allow is not accepted (the safetensors layout rules, non-finite weights,
// run-state fields no run can have written).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/checkpoint/dir_lock.hpp"
#include "ddp/core/error.hpp"

namespace ddp::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A safetensors file from a header and data bytes, the header as given.
std::string raw_file(const json& header, const std::string& data) {
  const std::string h = header.dump();
  std::string out(8, '\0');
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out[i] = char((len >> (8 * i)) & 0xff);
  return out + h + data;
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// The error decode_safetensors (or decode_checkpoint) gives; "" when none.
template <typename Decode>
std::string error_of(Decode&& decode) {
  try {
    decode();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a ddp::Error: ") + e.what();
  }
  return "";
}

std::string st_error(const std::string& bytes) {
  return error_of([&] { decode_safetensors("bad.safetensors", bytes); });
}

void expect_named(const std::string& msg, const std::string& part) {
  EXPECT_EQ(msg.rfind("bad.safetensors: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(part), std::string::npos) << "message lacks '" << part << "': " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

const json kEntry = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};

TEST(HostileSafetensors, MetadataThatIsNotAnObject) {
  expect_named(st_error(raw_file({{"__metadata__", "epoch=3"}, {"w", kEntry}}, floats({1, 2}))),
               "__metadata__ is not a JSON object");
  expect_named(st_error(raw_file({{"__metadata__", {1, 2}}, {"w", kEntry}}, floats({1, 2}))),
               "__metadata__ is not a JSON object");
}

TEST(HostileSafetensors, MetadataValuesOfTheWrongType) {
  expect_named(st_error(raw_file({{"__metadata__", {{"epoch", 3}}}, {"w", kEntry}}, floats({1, 2}))),
               "metadata 'epoch' is not a string");
  expect_named(st_error(raw_file({{"__metadata__", {{"epoch", {{"a", 1}}}}}, {"w", kEntry}}, floats({1, 2}))),
               "metadata 'epoch' is not a string");
}

TEST(HostileSafetensors, EntriesOfTheWrongShape) {
  expect_named(st_error(raw_file({{"w", "F32"}}, "")), "tensor 'w': entry is not a JSON object");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {2}}}}}, floats({1, 2}))),
               "tensor 'w': entry lacks dtype, shape or data_offsets");
  expect_named(st_error(raw_file({{"w", {{"dtype", 7}, {"shape", {2}}, {"data_offsets", {0, 8}}}}}, floats({1, 2}))),
               "tensor 'w': dtype is not a string");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}},
                                 floats({1, 2}))),
               "tensor 'w': shape [-2] holds something other than sizes >= 0");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", "2"}, {"data_offsets", {0, 8}}}}},
                                 floats({1, 2}))),
               "tensor 'w': shape is not an array");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0}}}}}, floats({1, 2}))),
               "tensor 'w': data_offsets is not a pair of offsets");
}

// A shape whose product overflows, or outgrows the file, is refused by
// arithmetic on the file's size: nothing is allocated for it.
TEST(HostileSafetensors, ShapesPastMemoryAndPastInt64) {
  const uint64_t big = uint64_t(1) << 62;
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {big, big, 4}}, {"data_offsets", {0, 8}}}}},
                                 floats({1, 2}))),
               "does not match its 8 bytes");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {uint64_t(1) << 40}}, {"data_offsets", {0, 8}}}}},
                                 floats({1, 2}))),
               "does not match its 8 bytes");
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {huge}}, {"data_offsets", {0, 8}}}}},
                                 floats({1, 2}))),
               "dimension beyond 2^63");
  expect_named(st_error(raw_file({{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, huge}}}}},
                                 floats({1, 2}))),
               "are outside the 8 data bytes");
}

TEST(HostileSafetensors, OffsetsThatOverlapLeaveGapsOrMissBytes) {
  const json a = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  const json overlap = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}};
  expect_named(st_error(raw_file({{"a", a}, {"b", overlap}}, floats({1, 2, 3}))),
               "tensor 'b' starts at byte 4 of the data, where 8 was expected (it overlaps the tensor before it)");
  const json same = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  expect_named(st_error(raw_file({{"a", a}, {"b", same}}, floats({1, 2}))), "overlaps the tensor before it");
  const json gap = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {12, 16}}};
  expect_named(st_error(raw_file({{"a", a}, {"b", gap}}, floats({1, 2, 3, 4}))), "a gap before it");
  const json late = {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}};
  expect_named(st_error(raw_file({{"a", late}}, floats({1, 2}))), "a gap before it");
  expect_named(st_error(raw_file({{"a", a}}, floats({1, 2, 3}))),
               "the tensors cover 8 of the 12 data bytes; the rest belongs to no tensor");
  // Zero-sized tensors take no bytes and sit anywhere in order.
  const json empty = {{"dtype", "F32"}, {"shape", {0, 3}}, {"data_offsets", {8, 8}}};
  EXPECT_EQ(st_error(raw_file({{"a", a}, {"e", empty}}, floats({1, 2}))), "");
}

// What a checkpoint's CRC cannot catch: values a writer computed the CRC for.
class HostileCheckpoint : public ::testing::Test {
 protected:
  RunState state() const {
    RunState s;
    s.epoch = 1;
    s.step_in_epoch = 2;
    s.global_step = 20;
    s.samples_consumed = 20 * 64;
    s.world_size = 4;
    s.epoch_loss_sum = 3.5;
    s.epoch_samples = 128;
    s.config = {{"model", "lenet"}};
    return s;
  }
  std::string decode_error(const RunState& s, const std::vector<float>& w) {
    const std::string bytes = encode_checkpoint(s, {{"w", {int64_t(w.size())}, w.data()}});
    return error_of([&] { decode_checkpoint("bad.safetensors", bytes); });
  }
  std::vector<float> w_ = {1, 2, 3};
};

TEST_F(HostileCheckpoint, NonFiniteWeightsAreRefusedNamingTheTensor) {
  EXPECT_EQ(decode_error(state(), w_), "");
  for (float v : {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
    const std::string msg = decode_error(state(), {1, v, 3});
    expect_named(msg, "tensor 'w' holds a NaN or an infinity (element 1)");
  }
}

TEST_F(HostileCheckpoint, RunStateOutOfRange) {
  RunState s = state();
  s.world_size = 0;
  expect_named(decode_error(s, w_), "'world_size' is 0");
  s = state();
  s.epoch = int64_t(1) << 60;
  expect_named(decode_error(s, w_), "metadata 'epoch' is not an integer from 0 to 1125899906842624");
  s = state();
  s.global_step = std::numeric_limits<int64_t>::max();
  expect_named(decode_error(s, w_), "metadata 'global_step' is not an integer");
  s = state();
  s.epoch_loss_sum = std::nan("");
  expect_named(decode_error(s, w_), "metadata 'epoch_loss_sum' is not a finite number >= 0");
  s = state();
  s.epoch_train_sec = -1;
  expect_named(decode_error(s, w_), "metadata 'epoch_train_sec' is not a finite number >= 0");
}

// Rotation keeps the newest checkpoints up to the one just written, never
// that one: files of later steps (a trajectory left behind when a run resumed
// from an earlier checkpoint) are not counted, and are not removed.
TEST(Rotation, NeverRemovesTheCheckpointJustWritten) {
  const std::string dir = (fs::temp_directory_path() / ("ddp_rot_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::vector<float> w = {1, 2};
  auto at = [](int64_t step) {
    RunState s;
    s.global_step = step;
    s.config = {{"model", "lenet"}};
    return s;
  };
  for (int64_t step : {40, 50}) save_checkpoint(dir, at(step), {{"w", {2}, w.data()}}, 2);
  for (int64_t step : {31, 32, 33}) {
    const std::string written = save_checkpoint(dir, at(step), {{"w", {2}, w.data()}}, 2);
    EXPECT_TRUE(fs::exists(written)) << "rotation removed " << written;
  }
  std::vector<std::string> names;
  for (const auto& p : list_checkpoints(dir)) names.push_back(fs::path(p).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{checkpoint_file_name(50), checkpoint_file_name(40),
                                             checkpoint_file_name(33), checkpoint_file_name(32)}));
  fs::remove_all(dir);
}

// Note [one job per checkpoint directory]: a second holder is refused naming
// the first; a holder that died leaves nothing in the way.
TEST(DirLock, SecondHolderIsRefusedNamingTheFirstAndADeadOneIsNot) {
  const std::string dir = (fs::temp_directory_path() / ("ddp_lock_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  {
    DirLock first(dir, "node7");
    const pid_t child = ::fork();
    if (child == 0) {
      // Another process, as a second job would be (flock is per open file).
      int code = 1;
      try {
        DirLock second(dir, "node8");
      } catch (const Error& e) {
        const std::string msg = e.what();
        code = msg.find("--checkpoint-dir " + dir + " is in use by another job (ddp_train pid " +
                        std::to_string(::getppid()) + " on host node7") != std::string::npos
                   ? 0
                   : 2;
      }
      ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "second holder not refused as expected";
  }
  // A holder that is gone: here a child that takes the lock and dies.
  const pid_t child = ::fork();
  if (child == 0) {
    DirLock held(dir, "node9");
    ::_exit(0);  // no destructor: the kernel drops the lock as the process ends
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_NO_THROW(DirLock again(dir, "node7"));
  fs::remove_all(dir);
}

TEST(DirLock, HolderRecordsItselfAndItsLauncher) {
  const LockHolder h = parse_lock_holder("ddp_train pid 4242 on host node3, launched by pid 4200");
  EXPECT_EQ(h.pid, 4242);
  EXPECT_EQ(h.host, "node3");
  EXPECT_EQ(h.launcher, 4200);
  // A lock file of an older ddp_train names no launcher: never an orphan.
  const LockHolder old = parse_lock_holder("ddp_train pid 17 on host node3");
  EXPECT_EQ(old.pid, 17);
  EXPECT_EQ(old.launcher, -1);
  EXPECT_FALSE(orphaned_holder(old, "node3", 1));
  EXPECT_EQ(parse_lock_holder("").pid, -1);
  // Orphaned: here, alive, with another parent than its launcher.
  EXPECT_TRUE(orphaned_holder(h, "node3", 1));
  EXPECT_FALSE(orphaned_holder(h, "node3", 4200));  // its launcher still there: a live job
  EXPECT_FALSE(orphaned_holder(h, "node4", 1));     // another host's: cannot be seen from here
  EXPECT_FALSE(orphaned_holder(h, "node3", -1));    // not a process here
  EXPECT_EQ(parent_of(::getpid()), ::getppid());
}

// A holder whose launcher is gone (a grandchild whose parent exited) is
// waited for, and the lock is taken once it ends; one whose launcher lives
// is refused at once; an orphan that outlives the wait is named.
TEST(DirLock, OrphanedHolderIsWaitedForAndALiveOneIsNot) {
  const std::string dir = (fs::temp_directory_path() / ("ddp_orphan_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string host = "node5";
  // A launcher (child) whose rank (grandchild) takes the lock and holds it
  // until killed; the launcher exits at once when `orphan`, else lives until
  // its rank ends. Returns the rank's pid, once it holds the lock.
  std::vector<pid_t> holders;  // killed at the end whatever happens, so that none outlives the test
  struct KillAll {
    std::vector<pid_t>& pids;
    ~KillAll() {
      for (pid_t p : pids) ::kill(p, SIGKILL);
    }
  } kill_all{holders};
  auto start_holder = [&](bool orphan, pid_t* launcher) {
    int to_launcher[2], to_test[2];
    EXPECT_EQ(::pipe(to_launcher), 0);
    EXPECT_EQ(::pipe(to_test), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      const pid_t rank = ::fork();
      if (rank == 0) {
        DirLock held(dir, host);
        const pid_t me = ::getpid();
        if (::write(to_launcher[1], &me, sizeof me) != sizeof me) ::_exit(3);
        for (;;) ::pause();
      }
      // Orphaned only once the rank holds the lock, naming this launcher.
      pid_t locked = -1;
      if (::read(to_launcher[0], &locked, sizeof locked) != sizeof locked ||
          ::write(to_test[1], &locked, sizeof locked) != sizeof locked)
        ::_exit(3);
      if (orphan) ::_exit(0);
      ::waitpid(rank, nullptr, 0);
      ::_exit(0);
    }
    *launcher = child;
    pid_t rank = -1;
    EXPECT_EQ(::read(to_test[0], &rank, sizeof rank), ssize_t(sizeof rank));
    for (int fd : {to_launcher[0], to_launcher[1], to_test[0], to_test[1]}) ::close(fd);
    holders.push_back(rank);
    if (orphan) ::waitpid(child, nullptr, 0);
    return rank;
  };

  pid_t launcher = -1;
  const pid_t orphan = start_holder(true, &launcher);
  std::string said;
  {
    DirLock mine(dir, host, 60, [&](const std::string& what) {
      said = what;
      ::kill(orphan, SIGKILL);  // the orphan ends while we wait
    });
  }
  EXPECT_NE(said.find("--checkpoint-dir " + dir + " is held by ddp_train pid " + std::to_string(orphan) +
                      " on host node5, launched by pid " + std::to_string(launcher) +
                      ", a rank of a job whose launcher is gone; waiting up to 60 s"),
            std::string::npos)
      << said;

  const pid_t live = start_holder(false, &launcher);
  said.clear();
  auto msg = error_of([&] { DirLock l(dir, host, 60, [&](const std::string& w) { said = w; }); });
  EXPECT_NE(msg.find("is in use by another job (ddp_train pid " + std::to_string(live)), std::string::npos) << msg;
  EXPECT_TRUE(said.empty()) << said;
  ::kill(live, SIGKILL);
  ::waitpid(launcher, nullptr, 0);

  const pid_t stays = start_holder(true, &launcher);
  msg = error_of([&] { DirLock l(dir, host, 0.2); });
  EXPECT_NE(msg.find(" is still held after 0.2 s by ddp_train pid " + std::to_string(stays)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("whose launcher is gone"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(DirLock, DirectoryThatCannotHoldCheckpointsIsRefused) {
  const std::string file = (fs::temp_directory_path() / ("ddp_notdir_" + std::to_string(::getpid()))).string();
  std::ofstream(file) << "x";
  auto msg = error_of([&] { DirLock l(file, "h"); });
  EXPECT_NE(msg.find("--checkpoint-dir " + file + ": exists and is not a directory"), std::string::npos) << msg;
  msg = error_of([&] { DirLock l(file + "/sub", "h"); });
  EXPECT_NE(msg.find("--checkpoint-dir " + file + "/sub: cannot create the directory"), std::string::npos) << msg;
  fs::remove(file);
}

}  // namespace
}  // namespace ddp::checkpoint
