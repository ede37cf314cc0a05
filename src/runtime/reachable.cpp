// check_reachable: the job's first message between ranks, bounded.
#include <mpi.h>

#include <algorithm>
#include <string>
#include <thread>

#include "ddp/core/error.hpp"           // Error, detail::concat
#include "ddp/runtime/mpi_check.hpp"    // mpi_error_string
#include "ddp/runtime/world.hpp"

namespace ddp {

const char* unreachable_hints() {
  return "likely causes: (1) a firewall between the nodes drops MPI's (or NCCL's) TCP traffic: allow TCP "
         "between them; (2) the wrong network interface (docker0, a second NIC, one without a route to the "
         "other nodes): name the one that connects the nodes, Open MPI: --mca btl_tcp_if_include <iface or "
         "subnet> --mca oob_tcp_if_include <iface or subnet>, NCCL: NCCL_SOCKET_IFNAME=<iface>; (3) GPU "
         "peer-to-peer trouble inside a node: NCCL_P2P_DISABLE=1; (4) a rank died or never started: see the "
         "launcher's messages above";
}

void check_reachable(const World& w, std::chrono::milliseconds timeout) {
  if (w.size == 1) return;
  // Open MPI has no asynchronous progress: the request moves only while we
  // test it. If it never completes it stays posted and its buffer with it
  // (static); the job is ending anyway.
  static int one;
  one = 1;
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, w.comm, &req);
  DDP_CHECK(rc == MPI_SUCCESS, "start-up reachability check: MPI_Iallreduce failed: ", mpi_error_string(rc));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int sleep_us = 1;
  for (;;) {
    int done = 0;
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    DDP_CHECK(rc == MPI_SUCCESS, "start-up reachability check: MPI_Test failed: ", mpi_error_string(rc), "; ",
              unreachable_hints());
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      const double sec = std::chrono::duration<double>(timeout).count();
      DDP_FAIL("ranks cannot reach each other (--preflight-timeout ", sec, " s): the start-up check, an all-reduce "
               "over all ", w.size, " ranks before anything else talks between nodes, did not complete; ",
               unreachable_hints());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(2 * sleep_us, 1000);
  }
  DDP_CHECK(one == w.size, "start-up reachability check: the all-reduce of one per rank gave ", one, " for ",
            w.size, " ranks");
}

}  // namespace ddp
