// A rank that dies or stops ends the whole job, naming it, and leaves nothing
// behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "run_outputs.hpp"

namespace ddp::test {
namespace {

// Every test here twice: on the CPU's ranks (MPI), and on NCCL ranks sharing
// one GPU (skipped without one), where a rank that dies or stops must also
// free the GPU: the others abort their NCCL communicator (ncclCommAbort) and
// exit, and no process of the job holds GPU memory afterwards.
class Reliability : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const std::string why = on_.unfit(); !why.empty()) GTEST_SKIP() << why;
  }
  const RanksOn on_ = ranks_on(GetParam());
};

// After the job: none of its ranks (pids) holds GPU memory any longer
// (nvidia-smi's compute processes); on the CPU nothing to check.
void expect_gpu_released(const RanksOn& on, const std::vector<int>& pids) {
  if (on.name == "cpu") return;
  const auto holding = gpu_compute_pids();
  if (!holding) {
    std::printf("note: no nvidia-smi here, so the GPU's release is not checked\n");
    return;
  }
  for (int pid : pids) EXPECT_EQ(holding->count(pid), 0u) << "pid " << pid << " still holds GPU memory";
}

// SIGKILL of rank 2 of 4 while it trains (as the OOM killer does): the job
// ends within 60 s with a non-zero status, the launcher names the rank and
// the signal, and no process of the job is left.
TEST_P(Reliability, KilledRankEndsTheJobNamingIt) {
  const std::string dir = make_temp_dir();
  BackgroundJob job(4,
                    "--synthetic 4096 --batch-size 128 --epochs 1000 --quiet --metrics-out " + dir + "/m.jsonl" +
                        on_.flags,
                    on_.wrapper);
  // Under way: an epoch is done, and the next is running.
  ASSERT_TRUE(wait_until([&] { return !read_text(dir + "/m.jsonl").empty(); }, 120)) << "no epoch within 120 s";
  std::vector<int> pids;
  for (int r = 0; r < 4; ++r) pids.push_back(job.rank_pid(r));
  const int pid = pids[2];
  ASSERT_GT(pid, 0) << "no process of rank 2";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_TRUE(wait_until([&] { return !job.running(); }, 60)) << "the job outlived its killed rank by 60 s";
  EXPECT_TRUE(wait_until([&] { return job.alive() == 0; }, 10)) << job.alive() << " processes left";
  const RunResult r = job.wait();
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("process rank 2 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("signal 9"), std::string::npos) << r.err;
  expect_gpu_released(on_, pids);
  remove_tree(dir);
}

// SIGSTOP of rank `rank` of 4 once an epoch is done (a hung process: alive,
// never arriving): the job must end within 60 s and leave no process, the
// stopped one included. The job's output, and the stopped rank's pid.
std::pair<RunResult, int> stop_a_rank(const RanksOn& on, int rank, const std::string& timeout) {
  const std::string dir = make_temp_dir();
  BackgroundJob job(4,
                    "--synthetic 4096 --batch-size 128 --epochs 1000 --quiet --timeout " + timeout +
                        " --metrics-out " + dir + "/m.jsonl" + on.flags,
                    on.wrapper);
  EXPECT_TRUE(wait_until([&] { return !read_text(dir + "/m.jsonl").empty(); }, 120)) << "no epoch within 120 s";
  std::vector<int> pids;
  for (int r = 0; r < 4; ++r) pids.push_back(job.rank_pid(r));
  const int pid = pids[size_t(rank)];
  EXPECT_GT(pid, 0) << "no process of rank " << rank;
  if (pid > 0) {
    EXPECT_EQ(::kill(pid, SIGSTOP), 0);
    EXPECT_TRUE(wait_until([&] { return !job.running(); }, 60)) << "the job outlived its stopped rank by 60 s";
    EXPECT_TRUE(wait_until([&] { return job.alive() == 0; }, 10)) << job.alive() << " processes left";
  } else {
    job.kill_all();  // nothing stopped: the job would train its 1000 epochs
  }
  remove_tree(dir);
  RunResult r = job.wait();
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("ddp_train: error: watchdog: "), std::string::npos) << r.err;
  expect_gpu_released(on, pids);
  return {r, pid};
}

// Rank 2 stopped: the collectives' own timeout would only say "did not
// complete". Rank 0's watchdog ends the job with one report naming the
// collective, its bucket, the ranks that reached it and rank 2 as not
// arrived.
TEST_P(Reliability, StoppedRankIsNamedByTheWatchdog) {
  const auto [r, pid] = stop_a_rank(on_, 2, "20");
  EXPECT_NE(r.err.find("\n  collective #"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("all-reduce of bucket "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n  reached it: ranks 0, 1, 3\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n  not arrived: rank 2 on host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", pid " + std::to_string(pid) + ": not heard from for "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(rank 0 ends the job)"), std::string::npos) << r.err;
}

// Rank 0, which collects the reports, stopped: rank 1 notices its silence
// and ends the job, naming it.
TEST_P(Reliability, StoppedRankZeroIsNamedByRankOne) {
  const auto [r, pid] = stop_a_rank(on_, 0, "10");
  EXPECT_NE(r.err.find("not arrived: rank 0 on host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", pid " + std::to_string(pid) + ": not heard from for "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(rank 1 ends the job)"), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(On, Reliability, ::testing::Values("cpu", "nccl_on_one_gpu"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ddp::test
