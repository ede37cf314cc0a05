// ddp::checkpoint::DirLock: one job per checkpoint directory.
//
// Note [one job per checkpoint directory]: two jobs writing one directory
// delete each other's checkpoints (rotation keeps the newest K of both, the
// start-up sweep removes the other's in-flight temporary files). Rank 0
// therefore holds an advisory lock (flock) on <dir>/.ddp_train.lock for the
// whole job, and the file says who holds it. The kernel releases a flock when
// its holder dies, however it dies, so a killed job never blocks its restart;
// a lock file left behind is taken over.
#pragma once

#include <string>

namespace ddp::checkpoint {

class DirLock {
 public:
  // Creates dir if needed, checks that it is a directory this process can
  // write in (a probe file is written and removed) and takes the lock.
  // Throws ddp::Error naming the directory and, when another job holds the
  // lock, that job's host and pid. `host` is written into the lock file.
  DirLock(const std::string& dir, const std::string& host);
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

// Checks that dir is a directory in which a file can be written and removed
// (creating it first when `create`). Throws ddp::Error "<what> <dir>:
// <problem>" (what: the flag it came from).
void check_writable_dir(const std::string& what, const std::string& dir, bool create);

}  // namespace ddp::checkpoint
