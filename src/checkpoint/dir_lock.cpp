#include "ddp/checkpoint/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

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

DirLock::DirLock(const std::string& dir, const std::string& host) {
  check_writable_dir("--checkpoint-dir", dir, /*create=*/true);
  const std::string path = (fs::path(dir) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) DDP_FAIL("--checkpoint-dir ", dir, ": cannot open the lock file ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char holder[256] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    std::string who = n > 0 ? std::string(holder, size_t(n)) : std::string();
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) {
      // Some cluster filesystems have no flock (Lustre mounted without it):
      // run unguarded rather than not at all, and say so.
      unguarded_ = detail::concat("--checkpoint-dir ", dir, ": the filesystem cannot lock ", path, " (",
                                  std::strerror(e), "): a second job given this directory would not be refused");
      return;
    }
    DDP_FAIL("--checkpoint-dir ", dir, " is in use by another job (",
             who.empty() ? std::string("holder not recorded yet") : who, ", lock file ", path,
             "); two jobs in one directory would delete each other's checkpoints: give each its own "
             "--checkpoint-dir, or wait for that job to end");
  }
  const std::string me = "ddp_train pid " + std::to_string(::getpid()) + " on host " + host + "\n";
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
