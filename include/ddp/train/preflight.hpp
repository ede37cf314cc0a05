// ddp::train::preflight: start-up checks run once, right after the
// communicator exists and before any real work: the job's first collective,
// bounded by its own short timeout (--preflight-timeout), so that ranks which
// cannot reach each other end the job with the likely causes named instead of
// waiting out --timeout; and a warning when two nodes share a hostname.
#pragma once

#include <chrono>
#include <iosfwd>

#include "ddp/comm/communicator.hpp"
#include "ddp/runtime/world.hpp"

namespace ddp::train {

// A one-element all-reduce over every rank, bounded by `timeout`. Throws
// ddp::Error naming the likely causes (firewall, network interface, GPU
// peer-to-peer, a rank that died) when it does not complete. Collective.
void check_connectivity(comm::Communicator& comm, std::chrono::milliseconds timeout);

// Rank 0 writes "ddp_train: warning: ..." to `err` when two different nodes
// (shared-memory domains, world.local_comm) report the same hostname.
// Collective.
void check_hostnames(comm::Communicator& comm, const World& world, std::ostream& err);

// Both, each bounded by `timeout`; the communicator's timeout is restored.
void preflight(comm::Communicator& comm, const World& world, std::chrono::milliseconds timeout,
               std::ostream& err);

}  // namespace ddp::train
