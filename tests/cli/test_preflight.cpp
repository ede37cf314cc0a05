// The start-up preflight: --preflight-timeout, the error that names the likely
// causes when ranks cannot all reach each other in time, and the hostname
// check staying quiet on one host. (Two fake hosts, an unreachable one and
// duplicate hostnames across nodes: tests/netns/.)
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "run_process.hpp"

namespace ddp::test {
namespace {

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(Preflight, BadTimeoutIsAUsageError) {
  auto zero = run_ddp_train(2, "--synthetic 600 --epochs 1 --preflight-timeout 0");
  EXPECT_NE(zero.status, 0);
  EXPECT_TRUE(has(zero.err, "ddp_train: error: --preflight-timeout must be positive, got 0")) << zero.err;
  auto word = run_ddp_train(2, "--synthetic 600 --epochs 1 --preflight-timeout soon");
  EXPECT_NE(word.status, 0);
  EXPECT_TRUE(has(word.err, "--preflight-timeout: 'soon' is not a number")) << word.err;
}

TEST(Preflight, HelpListsTheFlag) {
  auto r = run_ddp_train(0, "--help");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "--preflight-timeout")) << r.out;
}

// One host, short but sufficient bound: the check passes, the hostname check
// has nothing to say, and training runs as usual.
TEST(Preflight, PassesQuietlyOnOneHost) {
  auto r = run_ddp_train(4, "--synthetic 1200 --batch-size 64 --epochs 1 --quiet --preflight-timeout 20");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(has(r.out, "\"event\":\"summary\"")) << r.out;
  EXPECT_FALSE(has(r.err, "ddp_train: warning")) << r.err;
  EXPECT_FALSE(has(r.err, "ddp_train: error")) << r.err;
}

// A bound too short for any all-reduce (0.1 ms, rounded down to 0): the rank
// that enters the check first cannot have its peers' data at its first test,
// so it gives up at once. What it says is the error a user with an
// unreachable node sees: the likely causes, and the flag to change.
TEST(Preflight, TimeoutNamesTheLikelyCauses) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_ddp_train(4, "--synthetic 1200 --batch-size 64 --epochs 1 --quiet --preflight-timeout 0.0001");
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_LT(sec, 60.0);
  EXPECT_TRUE(has(r.err, "ddp_train: error: ranks cannot reach each other")) << r.err;
  for (const char* needle : {"--preflight-timeout", "firewall", "btl_tcp_if_include", "oob_tcp_if_include",
                             "NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "died or never started", "(rank "})
    EXPECT_TRUE(has(r.err, needle)) << "stderr lacks '" << needle << "':\n" << r.err;
  EXPECT_FALSE(has(r.out, "\"event\":\"summary\"")) << "a failed run printed a summary";
}

}  // namespace
}  // namespace ddp::test
