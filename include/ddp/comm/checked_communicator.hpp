// --debug-collectives: a Communicator that, before each collective, compares
// every rank's next call (its sequence number, kind, count and the caller's
// name for it, e.g. "all-reduce of bucket 3 of 5 (parameters 7..9)") and ends the
// job naming the ranks and both calls when they differ: the bug class "rank 0
// did an extra all-reduce", found at the call that goes wrong instead of as a
// hang or silently mixed buffers. The comparison is itself an allgather on
// the blocking communicator, so it costs a round trip per collective (off by
// default; bench/observe_cost.sh measures it).
#pragma once

#include <memory>

#include "ddp/comm/communicator.hpp"

namespace ddp::comm {

// Wraps inner (the MPI backend): every collective goes through the check,
// then to inner. Throws CollectiveError on a mismatch, on every rank alike.
std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner);

}  // namespace ddp::comm
