// A rank that dies ends the whole job, naming it, and leaves nothing behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>

#include "run_outputs.hpp"

namespace ddp::test {
namespace {

// SIGKILL of rank 2 of 4 while it trains (as the OOM killer does): the job
// ends within 60 s with a non-zero status, the launcher names the rank and
// the signal, and no process of the job is left.
TEST(Reliability, KilledRankEndsTheJobNamingIt) {
  const std::string dir = make_temp_dir();
  BackgroundJob job(4, "--synthetic 4096 --batch-size 128 --epochs 1000 --quiet --metrics-out " + dir + "/m.jsonl");
  // Under way: an epoch is done, and the next is running.
  ASSERT_TRUE(wait_until([&] { return !read_text(dir + "/m.jsonl").empty(); }, 120)) << "no epoch within 120 s";
  const int pid = job.rank_pid(2);
  ASSERT_GT(pid, 0) << "no process of rank 2";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_TRUE(wait_until([&] { return !job.running(); }, 60)) << "the job outlived its killed rank by 60 s";
  EXPECT_TRUE(wait_until([&] { return job.alive() == 0; }, 10)) << job.alive() << " processes left";
  const RunResult r = job.wait();
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("process rank 2 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("signal 9"), std::string::npos) << r.err;
  remove_tree(dir);
}

}  // namespace
}  // namespace ddp::test
