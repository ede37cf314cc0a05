#include "ddp/train/preflight.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"           // Error, detail::concat
#include "ddp/runtime/mpi_check.hpp"    // DDP_MPI_CHECK
#include "ddp/runtime/world.hpp"        // unreachable_hints

namespace ddp::train {

namespace {

// Restores the communicator's timeout however the preflight ends.
class TimeoutScope {
 public:
  TimeoutScope(comm::Communicator& comm, std::chrono::milliseconds t) : comm_(comm), saved_(comm.timeout()) {
    comm_.set_timeout(t);
  }
  ~TimeoutScope() { comm_.set_timeout(saved_); }
  TimeoutScope(const TimeoutScope&) = delete;
  TimeoutScope& operator=(const TimeoutScope&) = delete;

 private:
  comm::Communicator& comm_;
  const std::chrono::milliseconds saved_;
};

// The world rank of local rank 0 of this rank's node: one number per node,
// found without communication (group translation is local).
int node_leader(const World& world) {
  if (world.local_comm == MPI_COMM_NULL) return world.rank;
  MPI_Group local = MPI_GROUP_NULL, global = MPI_GROUP_NULL;
  DDP_MPI_CHECK(MPI_Comm_group(world.local_comm, &local));
  DDP_MPI_CHECK(MPI_Comm_group(world.comm, &global));
  const int zero = 0;
  int leader = MPI_UNDEFINED;
  DDP_MPI_CHECK(MPI_Group_translate_ranks(local, 1, &zero, global, &leader));
  MPI_Group_free(&local);
  MPI_Group_free(&global);
  DDP_CHECK(leader != MPI_UNDEFINED, "local rank 0 of rank ", world.rank, "'s node is not in the world");
  return leader;
}

// "0-1", "0, 2, 4", "0-3, 8": ranks (sorted) as ranges, at most 8 items.
std::string format_ranks(const std::vector<int>& ranks) {
  std::string s;
  int items = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (items == 8) return s + ", ...";
    if (!s.empty()) s += ", ";
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    ++items;
    i = j + 1;
  }
  return s;
}

struct HostInfo {
  char host[MPI_MAX_PROCESSOR_NAME];
  int32_t leader;  // world rank of local rank 0 of this rank's node
};

}  // namespace

void check_connectivity(comm::Communicator& comm, std::chrono::milliseconds timeout) {
  if (comm.size() == 1) return;
  TimeoutScope scope(comm, timeout);
  double one = 1.0;
  try {
    comm.allreduce_doubles(&one, 1, /*max=*/false, "start-up preflight");
  } catch (const Error& e) {
    throw Error(detail::concat("ranks cannot reach each other (--preflight-timeout ",
                               comm::format_duration(timeout), "): ", e.what(), "; ", unreachable_hints()));
  }
  DDP_CHECK(one == comm.size(), "start-up preflight: the all-reduce of one per rank gave ", one, " for ",
            comm.size(), " ranks");
}

void check_hostnames(comm::Communicator& comm, const World& world, std::ostream& err) {
  if (comm.size() == 1) return;
  HostInfo mine{};
  std::snprintf(mine.host, sizeof(mine.host), "%s", world.host.c_str());
  mine.leader = node_leader(world);
  const std::vector<char> all = comm.allgather(&mine, sizeof(mine), "start-up hostname check");
  if (world.rank != 0) return;
  std::vector<HostInfo> ranks(comm.size());
  std::memcpy(ranks.data(), all.data(), all.size());
  // hostname -> node (its leader) -> the node's ranks, all in rank order.
  std::map<std::string, std::map<int, std::vector<int>>> nodes;
  for (int r = 0; r < comm.size(); ++r) nodes[ranks[r].host][ranks[r].leader].push_back(r);
  for (const auto& [host, by_node] : nodes) {
    if (by_node.size() < 2) continue;
    std::string which;
    size_t i = 0;
    for (const auto& [leader, members] : by_node) {
      which += (i == 0 ? "" : i + 1 == by_node.size() ? " and " : ", ");
      which += "[" + format_ranks(members) + "]";
      ++i;
    }
    err << "ddp_train: warning: " << by_node.size() << " different nodes report the same hostname '" << host
        << "' (ranks " << which << ", one node each; nodes are the groups of ranks that share memory). "
        << "Transports that tell nodes apart by hostname get confused: Open MPI's shared-memory BTL (vader) "
        << "names its segments /dev/shm/vader_segment.<hostname>.*, which collide when the nodes share /dev/shm "
        << "(containers or network namespaces on one machine: crashes or hangs), and NCCL takes ranks with equal "
        << "hostnames for one machine (shared memory or peer-to-peer between machines fails or hangs). Give every "
        << "node its own hostname (docker --hostname, unshare --uts), or for NCCL set NCCL_HOSTID per node\n";
  }
  err.flush();
}

void preflight(comm::Communicator& comm, const World& world, std::chrono::milliseconds timeout,
               std::ostream& err) {
  check_connectivity(comm, timeout);
  TimeoutScope scope(comm, timeout);
  check_hostnames(comm, world, err);
}

}  // namespace ddp::train
