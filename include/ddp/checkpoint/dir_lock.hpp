// ddp::checkpoint::DirLock: one job per checkpoint directory.
//
// Note [one job per checkpoint directory]: two jobs writing one directory
// delete each other's checkpoints (rotation keeps the newest K of both, the
// start-up sweep removes the other's in-flight temporary files). Rank 0
// therefore holds an advisory lock (flock) on <dir>/.ddp_train.lock for the
// whole job, and the file says who holds it. The kernel releases a flock when
// its holder dies, however it dies, so a killed job never blocks its restart;
// a lock file left behind is taken over.
//
// A job whose launcher was killed outright (SIGKILL to mpirun, a requeue)
// leaves ranks that take a moment to notice and end, still holding the lock.
// The file therefore also records the holder's parent, its launcher, when it
// took the lock: a holder on this host whose parent is no longer that process
// is such an orphan, and a new job waits for it (a bounded time, saying so)
// instead of being refused. A holder with its launcher, or on another host,
// is a live job: refused at once.
#pragma once

#include <functional>
#include <string>

namespace ddp::checkpoint {

class DirLock {
 public:
  // Creates dir if needed, checks that it is a directory this process can
  // write in (a probe file is written and removed) and takes the lock.
  // Throws ddp::Error naming the directory and, when another job holds the
  // lock, that job's host and pid. `host` is written into the lock file.
  //
  // wait_s bounds the wait for an orphaned holder; on_wait (if set) is told
  // once, with what is waited for, when such a wait starts.
  DirLock(const std::string& dir, const std::string& host, double wait_s = 0,
          const std::function<void(const std::string&)>& on_wait = {});
  ~DirLock();  // releases the lock
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Why the directory is not locked although it could be used (a filesystem
  // without flock); empty when it is locked.
  const std::string& unguarded() const { return unguarded_; }

  static constexpr const char* kFileName = ".ddp_train.lock";

 private:
  int fd_ = -1;
  std::string unguarded_;
};

// What the lock file says of its holder: "ddp_train pid P on host H,
// launched by pid L". pid and launcher are -1 where the text does not say.
struct LockHolder {
  long pid = -1, launcher = -1;
  std::string host;
};
LockHolder parse_lock_holder(const std::string& text);

// The holder's parent now (/proc), -1 when the holder is not a process here.
long parent_of(long pid);

// An orphan of a launcher that is gone: on this host, alive, and its parent
// (parent_now, -1 if it is not alive here) no longer the launcher it recorded.
bool orphaned_holder(const LockHolder& h, const std::string& host, long parent_now);

// Checks that dir is a directory in which a file can be written and removed
// (creating it first when `create`). Throws ddp::Error "<what> <dir>:
// <problem>" (what: the flag it came from).
void check_writable_dir(const std::string& what, const std::string& dir, bool create);

}  // namespace ddp::checkpoint
