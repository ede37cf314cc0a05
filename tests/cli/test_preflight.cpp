// The start-up preflight: --preflight-timeout and the hostname check staying
// quiet on one host. (The error that names the likely causes when ranks
// cannot all reach each other in time: Timeout.ReachabilityCheck* in
// tests/mpi/ddp; two fake hosts, an unreachable one and duplicate hostnames
// across nodes: tests/netns/.)
#include <gtest/gtest.h>

#include <string>

#include "run_process.hpp"

namespace ddp::test {
namespace {

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(Preflight, BadTimeoutIsAUsageError) {
  auto zero = run_ddp_train(2, "--synthetic 600 --epochs 1 --preflight-timeout 0");
  EXPECT_NE(zero.status, 0);
  EXPECT_TRUE(has(zero.err, "ddp_train: error: --preflight-timeout 0 is out of range: it must be from 0.001 to "
                            "31536000 seconds"))
      << zero.err;
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

}  // namespace
}  // namespace ddp::test
