// Which GPU a rank binds (runtime/device.hpp): pure rules, so they are
// checked here without a GPU, messages included, since the messages are what
// a user who started the job wrong reads.
#include "ddp/runtime/device.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp {
namespace {

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "\"" << part << "\" not in: " << text;
}

World node_world(int rank, int local_rank, int local_size, const std::string& host = "gpu-node-7") {
  World w;
  w.rank = rank;
  w.size = 8;
  w.local_rank = local_rank;
  w.local_size = local_size;
  w.host = host;
  return w;
}

// The error choose_gpu throws, or "" when it does not.
std::string choose_error(const World& w, int visible, bool sharing, const std::string& why = "") {
  try {
    choose_gpu(w, visible, sharing, why);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceChoice, OneVisibleGpuIsDeviceZero) {
  // The launcher gave each rank its own GPU (per-rank CUDA_VISIBLE_DEVICES).
  for (int lr = 0; lr < 4; ++lr) {
    EXPECT_EQ(choose_gpu(node_world(lr, lr, 4), 1, false), 0);
    EXPECT_EQ(choose_gpu(node_world(lr, lr, 4), 1, true), 0);
  }
}

TEST(DeviceChoice, EnoughGpusGiveTheLocalRanksOwn) {
  for (int lr = 0; lr < 4; ++lr) {
    EXPECT_EQ(choose_gpu(node_world(4 + lr, lr, 4), 4, false), lr);
    EXPECT_EQ(choose_gpu(node_world(4 + lr, lr, 4), 8, false), lr);
    EXPECT_EQ(choose_gpu(node_world(4 + lr, lr, 4), 8, true), lr);
  }
}

TEST(DeviceChoice, SharingGoesRoundRobin) {
  for (int lr = 0; lr < 6; ++lr) EXPECT_EQ(choose_gpu(node_world(lr, lr, 6), 4, true), lr % 4);
  for (int lr = 0; lr < 4; ++lr) EXPECT_EQ(choose_gpu(node_world(lr, lr, 4), 2, true), lr % 2);
}

TEST(DeviceChoice, TooFewGpusWithoutSharingNamesRankHostAndCounts) {
  const std::string msg = choose_error(node_world(5, 3, 4), 2, false);
  ASSERT_FALSE(msg.empty()) << "4 ranks on 2 GPUs without sharing must be refused";
  expect_contains(msg, "rank 5");
  expect_contains(msg, "gpu-node-7");
  expect_contains(msg, "local rank 3 of 4");
  expect_contains(msg, "2 GPUs");
  expect_contains(msg, "--backend mpi");
}

TEST(DeviceChoice, NoGpuIsAnErrorThatSaysWhatToDo) {
  const std::string msg = choose_error(node_world(2, 2, 4), 0, false, "cudaGetDeviceCount: no driver");
  ASSERT_FALSE(msg.empty());
  expect_contains(msg, "no CUDA device");
  expect_contains(msg, "--device cpu");
  expect_contains(msg, "gpu-node-7");
  expect_contains(msg, "GPUs seen: 0");
  expect_contains(msg, "cudaGetDeviceCount: no driver");
  // Sharing does not help without a GPU.
  EXPECT_FALSE(choose_error(node_world(0, 0, 1), 0, true).empty());
}

TEST(SharedGpu, DistinctGpusAreNotShared) {
  const std::vector<GpuId> ranks = {
      {"a", "0000:19:00.0"}, {"a", "0000:3b:00.0"}, {"b", "0000:19:00.0"}, {"b", "0000:3b:00.0"}};
  EXPECT_FALSE(find_shared_gpu(ranks).has_value());
}

TEST(SharedGpu, SameBusIdOnTwoHostsIsNotShared) {
  // Identical machines have identical bus ids: only host and bus id together
  // name a GPU.
  const std::vector<GpuId> ranks = {{"node1", "0000:19:00.0"}, {"node2", "0000:19:00.0"}};
  EXPECT_FALSE(find_shared_gpu(ranks).has_value());
}

TEST(SharedGpu, FindsTheFirstPairInRankOrder) {
  const std::vector<GpuId> ranks = {{"node1", "0000:19:00.0"}, {"node2", "0000:19:00.0"},
                                    {"node2", "0000:3b:00.0"}, {"node2", "0000:19:00.0"},
                                    {"node1", "0000:19:00.0"}};
  const auto pair = find_shared_gpu(ranks);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(pair->first, 1);
  EXPECT_EQ(pair->second, 3);
}

TEST(SharedGpu, EmptyOrSingleWorldHasNoPair) {
  EXPECT_FALSE(find_shared_gpu({}).has_value());
  EXPECT_FALSE(find_shared_gpu({{"node1", "0000:19:00.0"}}).has_value());
}

TEST(SharedGpu, MessageNamesRanksGpuHostAndCounts) {
  const std::vector<GpuId> ranks = {{"node1", "0000:19:00.0"}, {"node2", "0000:19:00.0"},
                                    {"node2", "0000:19:00.0"}, {"node2", "0000:19:00.0"}};
  const auto pair = find_shared_gpu(ranks);
  ASSERT_TRUE(pair.has_value());
  const std::string msg = shared_gpu_message(ranks, *pair, 1);
  expect_contains(msg, "ranks 1 and 2");
  expect_contains(msg, "0000:19:00.0");
  expect_contains(msg, "node2");
  expect_contains(msg, "3 ranks there");
  expect_contains(msg, "1 GPU visible");
  expect_contains(msg, "one GPU per rank");
  expect_contains(msg, "--backend mpi");
}

// NCCL takes NCCL_HOSTID for the host where it is set: ranks with their own
// are other hosts to it (its socket transport joins them), so several ranks
// may test NCCL on one GPU; the same NCCL_HOSTID on two hosts makes one.
TEST(SharedGpu, NcclHostIdIsTheHostWhereSet) {
  EXPECT_EQ(nccl_host({"node1", "0000:19:00.0", ""}), "node1");
  EXPECT_EQ(nccl_host({"node1", "0000:19:00.0", "h1"}), "h1");
  EXPECT_FALSE(find_shared_gpu({{"node1", "0000:19:00.0", "h0"}, {"node1", "0000:19:00.0", "h1"}}).has_value());
  const std::vector<GpuId> same_id = {{"node1", "0000:19:00.0", "h"}, {"node2", "0000:19:00.0", "h"}};
  const auto pair = find_shared_gpu(same_id);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(*pair, std::make_pair(0, 1));
  // One rank with it, one without: the hostname is the other's host.
  EXPECT_FALSE(find_shared_gpu({{"node1", "0000:19:00.0", "h0"}, {"node1", "0000:19:00.0", ""}}).has_value());
  EXPECT_TRUE(find_shared_gpu({{"node1", "0000:19:00.0", "node1"}, {"node1", "0000:19:00.0", ""}}).has_value());
}

TEST(SharedGpu, MessageNamesTheNcclHostIdTheRanksShare) {
  const std::vector<GpuId> ranks = {{"node1", "0000:19:00.0", "h0"}, {"node1", "0000:19:00.0", "h1"},
                                    {"node1", "0000:19:00.0", "h1"}};
  const auto pair = find_shared_gpu(ranks);
  ASSERT_TRUE(pair.has_value());
  const std::string msg = shared_gpu_message(ranks, *pair, 1);
  expect_contains(msg, "ranks 1 and 2 both use GPU 0000:19:00.0 on host node1 with NCCL_HOSTID=h1");
  expect_contains(msg, "2 ranks there");
  expect_contains(msg, "give each rank its own NCCL_HOSTID");
  // Without NCCL_HOSTID the message says nothing of it.
  const std::vector<GpuId> plain = {{"node1", "0000:19:00.0", ""}, {"node1", "0000:19:00.0", ""}};
  EXPECT_EQ(shared_gpu_message(plain, *find_shared_gpu(plain), 1).find("NCCL_HOSTID"), std::string::npos);
}

}  // namespace
}  // namespace ddp
