// ddp::comm::Watchdog: which rank, which collective, when a job stalls.
//
// Every collective the training thread issues through a watched communicator
// gets a sequence number (1, 2, ... in issue order, the same on every rank),
// and the communicator's caller's name for it ("all-reduce of bucket 1 of 2
// (parameters 4..9: fc1.bias .. conv2.weight)") with its bytes. A thread per
// rank reports what its rank last entered and what it still waits for to
// rank 0, over a communicator of its own (a stuck collective does not block
// it), every interval. Rank 0 ends the job (MPI_Abort, after the abort hooks:
// ncclCommAbort on NCCL) with one report on its stderr (stall_report) when a
// collective has waited longer than the timeout it was issued under, or a
// rank has not been heard from for --timeout. The other ranks watch rank 0
// the same way. The collectives' own timeouts stay as a backstop, later by
// the grace, so the watchdog's report comes first.
//
// Note [what is watched]: only calls from the thread that made the
// Watchdog, and only the outermost (a communicator that delegates to
// another, as the GPU ones do to the MPI one, is not counted twice); other
// threads (a staging thread) issue in an order that differs between ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/runtime/world.hpp"

namespace ddp::comm {

class DeviceCommunicator;
class Tracker;

// What rank 0 knows of one rank: stall_report's input.
struct RankView {
  int rank = 0;
  std::string host;
  int pid = 0;
  double heard_ago_s = 0;      // since its last report arrived
  bool finished = false;       // it stopped watching cleanly (end of training)
  uint64_t entered_seq = 0;    // the last collective it entered; 0: none yet
  std::string entered;         // that collective's description
  uint64_t pending_seq = 0;    // its oldest collective not yet complete; 0: none
  std::string pending;         // that collective's description
  double pending_s = 0;        // how long it has waited for it, as of now
  double pending_limit_s = 0;  // the timeout it was issued under
  double idle_s = 0;           // since it last entered or completed a collective
};

// The report that ends the job, or "" while nothing is stuck. Stuck: a rank
// heard from within silent_after_s waits for a collective longer than its
// limit, or a rank has not been heard from for longer than silent_after_s.
// The report names the oldest collective waited for (seq, description,
// bytes), the ranks that reached it, and for every other rank its host, pid,
// last collective entered and when it was last heard from: not heard from
// (stopped or dead) or alive and busy outside collectives. Once the report is
// due, "not heard from" is any rank silent for longer than quiet_after_s
// (several report intervals; at most silent_after_s). First line
// without a newline at the end of the last.
std::string stall_report(const std::vector<RankView>& ranks, double silent_after_s, double quiet_after_s);

// "all-reduce of bucket 1 of 2 (...), 1.5 MiB": how the watchdog names a
// collective, from its kind, the caller's name for it, and its bytes.
std::string collective_label(const std::string& kind, const std::string& what, const std::string& bytes);

class Watchdog {
 public:
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // --timeout: silence and waiting allowed
    std::chrono::milliseconds interval{0};                        // between reports; 0: timeout / 10 in [50 ms, 1 s]
  };

  // Collective over world.comm: duplicates it and gathers every rank's host
  // and pid, then starts the thread. A world of one watches nothing.
  Watchdog(const World& world, Options options);
  // Without stop(): the thread ends at once, the channel is left as it is
  // (the job is ending by an error).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Numbers and reports every collective through `inner` (Note [what is
  // watched]). The collectives themselves then time out at the timeout set
  // on the returned communicator plus grace().
  std::unique_ptr<Communicator> watch(std::unique_ptr<Communicator> inner);
#if DDP_HAVE_CUDA
  std::unique_ptr<DeviceCommunicator> watch(std::unique_ptr<DeviceCommunicator> inner);
#endif
  // Run on this rank before it ends the job (e.g. ncclCommAbort).
  void on_abort(std::function<void()> hook);

  // Ends the watching on every rank together (a goodbye to rank 0 and
  // back), so that no rank reports a peer that finished as silent.
  // Collective: call at the same point on every rank, after the last
  // collective.
  void stop();

  std::chrono::milliseconds grace() const;
  std::chrono::milliseconds interval() const;

 private:
  const std::shared_ptr<Tracker>& tracker() const;
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::comm
