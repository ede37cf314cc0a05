#include "ddp/checkpoint/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/core/error.hpp"

namespace ddp::checkpoint {

namespace fs = std::filesystem;

void check_writable_dir(const std::string& what, const std::string& dir, bool create) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) DDP_FAIL(what, " ", dir, ": exists and is not a directory");
  } else if (!create) {
    DDP_FAIL(what, " ", dir, ": no such directory");
  } else {
    fs::create_directories(dir, ec);
    if (ec) DDP_FAIL(what, " ", dir, ": cannot create the directory: ", ec.message());
  }
  const std::string probe = (fs::path(dir) / (".ddp_train.probe." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DDP_FAIL(what, " ", dir, ": cannot write in the directory: ", std::strerror(errno));
  const bool wrote = ::write(fd, "probe\n", 6) == 6;
  const int write_errno = errno;
  ::close(fd);
  if (::unlink(probe.c_str()) != 0)
    DDP_FAIL(what, " ", dir, ": cannot remove a file written there (", probe, "): ", std::strerror(errno));
  if (!wrote) DDP_FAIL(what, " ", dir, ": cannot write in the directory: ", std::strerror(write_errno));
}

LockHolder parse_lock_holder(const std::string& text) {
  LockHolder h;
  char host[256] = {0};
  long pid = -1, launcher = -1;
  const int n = std::sscanf(text.c_str(), "ddp_train pid %ld on host %255[^,\n], launched by pid %ld", &pid, host,
                            &launcher);
  if (n >= 1) h.pid = pid;
  if (n >= 2) h.host = host;
  if (n >= 3) h.launcher = launcher;
  return h;
}

long parent_of(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (pid <= 0 || !std::getline(in, stat)) return -1;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  char state = 0;
  long ppid = -1;
  if (std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) != 2 || state == 'Z') return -1;
  return ppid;
}

bool orphaned_holder(const LockHolder& h, const std::string& host, long parent_now) {
  return h.pid > 0 && h.launcher > 0 && h.host == host && parent_now >= 0 && parent_now != h.launcher;
}

namespace {

// Who holds the lock, as its file says ("" if not written yet).
std::string read_holder(int fd) {
  char holder[256] = {0};
  const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
  std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string();
  while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
  return who;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& host, double wait_s,
                 const std::function<void(const std::string&)>& on_wait) {
  check_writable_dir("--checkpoint-dir", dir, /*create=*/true);
  const std::string path = (fs::path(dir) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) DDP_FAIL("--checkpoint-dir ", dir, ": cannot open the lock file ", path, ": ", std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  bool waiting = false;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) {
      ::close(fd_);
      fd_ = -1;
      // Some cluster filesystems have no flock (Lustre mounted without it):
      // run unguarded rather than not at all, and say so.
      unguarded_ = detail::concat("--checkpoint-dir ", dir, ": the filesystem cannot lock ", path, " (",
                                  std::strerror(e), "): a second job given this directory would not be refused");
      return;
    }
    const std::string who = read_holder(fd_);
    const LockHolder h = parse_lock_holder(who);
    const long parent = parent_of(h.pid);
    // An orphan waited for that is no longer a process here is ending: its
    // lock goes with its last file.
    const bool orphan = orphaned_holder(h, host, parent) || (waiting && parent < 0);
    if (!orphan || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd_);
      fd_ = -1;
      if (orphan)
        DDP_FAIL("--checkpoint-dir ", dir, " is still held after ", wait_s, " s by ", who,
                 ", whose launcher is gone (lock file ", path, "): end that process (kill ", h.pid,
                 ") and start again");
      DDP_FAIL("--checkpoint-dir ", dir, " is in use by another job (",
               who.empty() ? std::string("holder not recorded yet") : who, ", lock file ", path,
               "); two jobs in one directory would delete each other's checkpoints: give each its own "
               "--checkpoint-dir, or wait for that job to end");
    }
    if (!waiting && on_wait)
      on_wait(detail::concat("--checkpoint-dir ", dir, " is held by ", who, ", a rank of a job whose launcher is "
                             "gone; waiting up to ", wait_s, " s for it to end"));
    waiting = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string me = detail::concat("ddp_train pid ", ::getpid(), " on host ", host, ", launched by pid ",
                                        ::getppid(), "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    DDP_FAIL("--checkpoint-dir ", dir, ": cannot write the lock file ", path, ": ", std::strerror(e));
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace ddp::checkpoint
