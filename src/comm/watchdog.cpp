// Watchdog (comm/watchdog.hpp).
//
// Note [watchdog channel]: the reports travel on a duplicate of world.comm
// that only the watchdog threads use, as point-to-point messages of one
// fixed size: every rank sends to rank 0, rank 0 sends to every rank. No
// thread ever blocks inside MPI (each request is tested once an interval), so
// a stopped or dead peer costs nothing but silence, and a send is not
// started while the last one to the same peer is still in flight, so a peer
// that stopped reading cannot pile messages up. At the end the ranks say
// goodbye (every rank to rank 0, then rank 0 to every rank): messages between
// two ranks arrive in order, so once each side has the other's goodbye no
// message is left unmatched and the channel can be freed.
#include "ddp/comm/watchdog.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "ddp/core/error.hpp"
#include "ddp/runtime/mpi_check.hpp"
#include "watched.hpp"

namespace ddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string where(const RankView& v) {
  return detail::concat("rank ", v.rank, " on host ", v.host.empty() ? "?" : v.host, ", pid ", v.pid);
}

std::string last_entered(const RankView& v) {
  if (v.entered_seq == 0) return "no collective entered yet";
  return detail::concat("last collective entered: #", v.entered_seq, ", ", v.entered);
}

// A silent rank's last report can be an interval older than its last act.
std::string silent_since(const RankView& v, uint64_t waited_for) {
  std::string s = detail::concat("not heard from for ", secs(v.heard_ago_s), " (stopped or dead); at its last report ");
  if (v.entered_seq == 0) return s + "it had entered no collective";
  return s + detail::concat("it had entered #", v.entered_seq, v.entered_seq == waited_for ? " (this one)" : "", ", ",
                            v.entered);
}

// One fixed-size report on the channel (Note [watchdog channel]).
struct Beat {
  uint64_t entered_seq = 0, pending_seq = 0;
  double pending_s = 0, pending_limit_s = 0, idle_s = 0;
  int32_t bye = 0, pad = 0;
  char entered[200] = {}, pending[200] = {};
};

struct Peer {
  int32_t pid;
  char host[92];
};

constexpr int kTag = 7;

}  // namespace

std::string collective_label(const std::string& kind, const std::string& what, const std::string& bytes) {
  // The reducer's names start with their kind ("all-reduce of bucket ...").
  const bool named = what.compare(0, kind.size(), kind) == 0;
  return (named ? what : kind + " (" + what + ")") + ", " + bytes;
}

std::string stall_report(const std::vector<RankView>& ranks, double silent_after_s, double quiet_after_s) {
  const auto silent = [&](const RankView& v) { return !v.finished && v.heard_ago_s > silent_after_s; };
  // Once a report is due, a rank whose reports stopped several intervals
  // ago is described as not heard from, though not yet silent long enough
  // to end the job by itself (stopped a moment after the others entered).
  const auto unheard = [&](const RankView& v) {
    return !v.finished && v.heard_ago_s > std::min(quiet_after_s, silent_after_s);
  };
  // The collective the job waits for: the oldest any rank still heard from waits for.
  const RankView* oldest = nullptr;
  for (const RankView& v : ranks) {
    if (silent(v) || v.pending_seq == 0) continue;
    if (!oldest || v.pending_seq < oldest->pending_seq ||
        (v.pending_seq == oldest->pending_seq && v.pending_s > oldest->pending_s))
      oldest = &v;
  }
  const bool stuck = oldest && oldest->pending_s > oldest->pending_limit_s;
  std::vector<int> quiet;
  for (const RankView& v : ranks)
    if (silent(v)) quiet.push_back(v.rank);
  if (!stuck && quiet.empty()) return "";

  std::ostringstream out;
  out << "watchdog: ";
  if (stuck)
    out << "collective #" << oldest->pending_seq << " has not completed after " << secs(oldest->pending_s)
        << " (--timeout " << secs(oldest->pending_limit_s) << ")";
  else
    out << rank_list(quiet) << " not heard from for more than " << secs(silent_after_s) << " (--timeout "
        << secs(silent_after_s) << ")";
  if (oldest)
    out << "\n  collective #" << oldest->pending_seq << ": " << oldest->pending << "; waiting for "
        << secs(oldest->pending_s);
  if (oldest) {
    const uint64_t seq = oldest->pending_seq;
    // A rank counts as arrived while it reports: one that entered the
    // collective and then fell silent holds it up as much as one that never
    // came (its part is not moving).
    std::vector<int> reached;
    for (const RankView& v : ranks)
      if (!unheard(v) && v.entered_seq >= seq) reached.push_back(v.rank);
    out << "\n  reached it: " << rank_list(reached);
    for (const RankView& v : ranks) {
      if (!unheard(v) && v.entered_seq >= seq) continue;
      out << "\n  not arrived: " << where(v) << ": ";
      if (unheard(v))
        out << silent_since(v, seq);
      else
        out << "alive (heard from " << secs(v.heard_ago_s) << " ago), busy outside collectives for "
            << secs(v.idle_s) << "; " << last_entered(v);
    }
  } else {
    for (const RankView& v : ranks) {
      if (!silent(v)) continue;
      out << "\n  " << where(v) << ": " << silent_since(v, 0);
    }
  }
  return out.str();
}

class Watchdog::Impl {
 public:
  Impl(const World& world, Options opt)
      : rank_(world.rank), size_(world.size), opt_(opt), tracker_(std::make_shared<Tracker>()) {
    if (opt_.interval.count() <= 0)
      opt_.interval = std::clamp(opt_.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
    if (size_ == 1) return;
    DDP_MPI_CHECK(MPI_Comm_dup(world.comm, &comm_));
    MPI_Comm_set_name(comm_, "ddp watchdog");
    Peer mine{};
    mine.pid = int32_t(::getpid());
    std::snprintf(mine.host, sizeof mine.host, "%s", world.host.c_str());
    peers_.resize(size_t(size_));
    DDP_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, peers_.data(), sizeof mine, MPI_BYTE, comm_));
    thread_ = std::thread([this] {
      // An exception leaving the thread would end the process without a
      // word (std::terminate); the job ends saying it instead.
      try {
        run();
      } catch (const std::exception& e) {
        abort_with(std::string("the watchdog failed: ") + e.what());
      } catch (...) {
        abort_with("the watchdog failed");
      }
    });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    // Without a clean stop the channel keeps its posted requests: leaked,
    // as the job is ending (Note [abandoned requests] in mpi_communicator.cpp).
  }

  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void on_abort(std::function<void()> hook) {
    std::lock_guard<std::mutex> lk(mu_);
    hooks_.push_back(std::move(hook));
  }

  std::chrono::milliseconds grace() const {
    // The report comes within an interval of the timeout; the collectives'
    // own bound waits well past that.
    return std::max(std::chrono::milliseconds(std::chrono::seconds(5)), opt_.timeout / 10) + 3 * opt_.interval;
  }
  std::chrono::milliseconds interval() const { return opt_.interval; }
  const std::shared_ptr<Tracker>& tracker() const { return tracker_; }

 private:
  struct Slot {
    Beat beat;
    Clock::time_point heard;
    MPI_Request send = MPI_REQUEST_NULL;
    Beat out;  // the send's buffer
  };

  static bool test(MPI_Request* r) {
    if (*r == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Test(r, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

  Beat own(bool bye) {
    const TrackerSnapshot s = tracker_->snapshot();
    Beat b;
    b.entered_seq = s.entered_seq;
    b.pending_seq = s.pending_seq;
    b.pending_s = s.pending_s;
    b.pending_limit_s = s.pending_limit_s;
    b.idle_s = s.idle_s;
    b.bye = bye;
    std::snprintf(b.entered, sizeof b.entered, "%s", s.entered.c_str());
    std::snprintf(b.pending, sizeof b.pending, "%s", s.pending.c_str());
    return b;
  }

  RankView view(int r, const Beat& b, double heard_ago) const {
    RankView v;
    v.rank = r;
    v.host = std::string(peers_[size_t(r)].host, strnlen(peers_[size_t(r)].host, sizeof peers_[0].host));
    v.pid = peers_[size_t(r)].pid;
    v.heard_ago_s = heard_ago;
    v.finished = b.bye != 0;
    v.entered_seq = b.entered_seq;
    v.entered = std::string(b.entered, strnlen(b.entered, sizeof b.entered));
    v.pending_seq = b.pending_seq;
    v.pending = std::string(b.pending, strnlen(b.pending, sizeof b.pending));
    // Its figures as of now: they were measured when it sent them.
    v.pending_s = b.pending_seq ? b.pending_s + heard_ago : 0;
    v.pending_limit_s = b.pending_limit_s;
    v.idle_s = b.idle_s + heard_ago;
    return v;
  }

  [[noreturn]] void abort_with(const std::string& report) {
    std::fprintf(stderr, "ddp_train: error: %s\n  (rank %d ends the job)\n", report.c_str(), rank_);
    std::fflush(stderr);
    std::vector<std::function<void()>> hooks;
    {
      std::lock_guard<std::mutex> lk(mu_);
      hooks = hooks_;
    }
    for (auto& h : hooks) {
      try {
        h();
      } catch (...) {
      }
    }
    abort_world(1);
  }

  void send(Slot& s, int to, const Beat& b) {
    s.out = b;
    MPI_Isend(&s.out, sizeof s.out, MPI_BYTE, to, kTag, comm_, &s.send);
  }

  void run() {
    const auto start = Clock::now();
    std::vector<Slot> slots(static_cast<size_t>(size_));
    for (Slot& s : slots) s.heard = start;
    Beat in;
    MPI_Request recv = MPI_REQUEST_NULL;
    MPI_Status status;
    const int from = rank_ == 0 ? MPI_ANY_SOURCE : 0;
    MPI_Irecv(&in, sizeof in, MPI_BYTE, from, kTag, comm_, &recv);
    const double silent_after = std::chrono::duration<double>(opt_.timeout).count();
    const double quiet_after = std::max(3.0, 5 * std::chrono::duration<double>(opt_.interval).count());
    // Ranks other than 1 give rank 1 a head start at reporting rank 0's
    // silence, so that one rank says it rather than all.
    const double root_silent_after =
        silent_after + (rank_ > 1 ? 5 * std::chrono::duration<double>(opt_.interval).count() : 0);
    bool bye_sent = false, stopping = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        // stop() wakes the thread; the goodbyes then go quickly.
        cv_.wait_for(lk, stopping ? std::chrono::milliseconds(5) : opt_.interval,
                     [&] { return quit_ || (stopping_ && !stopping); });
        if (quit_) return;
        stopping = stopping_;
      }
      const auto now = Clock::now();
      for (;;) {
        int flag = 0;
        MPI_Test(&recv, &flag, &status);
        if (!flag) break;
        const int src = rank_ == 0 ? status.MPI_SOURCE : 0;
        slots[size_t(src)].beat = in;
        slots[size_t(src)].heard = now;
        MPI_Irecv(&in, sizeof in, MPI_BYTE, from, kTag, comm_, &recv);
      }
      const auto ago = [&](int r) { return std::chrono::duration<double>(now - slots[size_t(r)].heard).count(); };

      if (rank_ == 0) {
        // One look at this rank per interval: for the table, then sent.
        Beat mine = own(stopping);
        std::vector<RankView> views;
        views.push_back(view(0, mine, 0));
        bool all_bye = true;
        for (int r = 1; r < size_; ++r) {
          views.push_back(view(r, slots[size_t(r)].beat, ago(r)));
          all_bye = all_bye && slots[size_t(r)].beat.bye;
        }
        const std::string report = stall_report(views, silent_after, quiet_after);
        if (!report.empty()) abort_with(report);
        if (stopping && all_bye) {
          for (int r = 1; r < size_; ++r) {
            Slot& s = slots[size_t(r)];
            while (!test(&s.send)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            send(s, r, mine);  // the goodbye
          }
          break;
        }
        // Not a goodbye until every rank has said its own: a rank that
        // receives rank 0's stops watching.
        mine.bye = 0;
        for (int r = 1; r < size_; ++r)
          if (test(&slots[size_t(r)].send)) send(slots[size_t(r)], r, mine);
      } else {
        const Slot& root = slots[0];
        if (root.beat.bye) break;  // rank 0's goodbye: stopping on every rank
        if (ago(0) > root_silent_after) {
          const std::vector<RankView> views = {view(0, root.beat, ago(0)), view(rank_, own(false), 0)};
          abort_with(stall_report(views, silent_after, quiet_after) + "\n  (what rank " + std::to_string(rank_) +
                     " knows: rank 0 collects the other ranks' reports)");
        }
        Slot& s = slots[0];
        if (!bye_sent && test(&s.send)) {
          send(s, 0, own(stopping));
          bye_sent = stopping;
        }
      }
    }
    // Clean end (Note [watchdog channel]): every send was received.
    for (Slot& s : slots)
      while (!test(&s.send)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    MPI_Cancel(&recv);
    MPI_Wait(&recv, MPI_STATUS_IGNORE);
    MPI_Comm_free(&comm_);
  }

  const int rank_, size_;
  Options opt_;
  std::shared_ptr<Tracker> tracker_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<Peer> peers_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false, stopping_ = false;
  std::vector<std::function<void()>> hooks_;
};

Watchdog::Watchdog(const World& world, Options options) : impl_(std::make_unique<Impl>(world, options)) {}
Watchdog::~Watchdog() = default;

std::unique_ptr<Communicator> Watchdog::watch(std::unique_ptr<Communicator> inner) {
  return std::make_unique<Watched<Communicator>>(std::move(inner), tracker(), grace());
}

const std::shared_ptr<Tracker>& Watchdog::tracker() const { return impl_->tracker(); }

void Watchdog::on_abort(std::function<void()> hook) { impl_->on_abort(std::move(hook)); }
void Watchdog::stop() { impl_->stop(); }
std::chrono::milliseconds Watchdog::grace() const { return impl_->grace(); }
std::chrono::milliseconds Watchdog::interval() const { return impl_->interval(); }

}  // namespace ddp::comm
