#include "ddp/train/progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

namespace ddp::train {

Progress::Progress(std::ostream& out, bool live, int64_t every, int epochs, int64_t steps, int global_batch)
    : out_(out),
      live_(live),
      every_(every > 0 ? every : live ? 1 : (steps + 3) / 4),
      epochs_(epochs),
      steps_(steps),
      global_batch_(global_batch) {}

namespace {

std::string read_proc(pid_t pid, const char* what) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/" + what);
  std::string s;
  std::getline(f, s);
  return s;
}

pid_t parent_of(pid_t pid) {
  // /proc/PID/stat: "pid (comm) state ppid ...": the comm may hold spaces.
  const std::string stat = read_proc(pid, "stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  char state = 0;
  long ppid = 0;
  rest >> state >> ppid;
  return pid_t(ppid);
}

}  // namespace

// Note [whose terminal]: Open MPI gives each rank a pseudo-terminal of its
// own, whatever mpirun's output goes to, so the rank's isatty says nothing
// about the user's screen. Under Open MPI the answer is mpirun's: its stdout
// a terminal (mpirun started from a shell) or not (a pipe, a file, a Slurm
// log). A rank under a remote daemon (orted) is not on the user's terminal.
bool Progress::stdout_is_terminal() {
  if (isatty(STDOUT_FILENO) != 1) return false;
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return true;  // a plain process: its own stdout
  pid_t pid = getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth, pid = parent_of(pid)) {
    const std::string comm = read_proc(pid, "comm");
    if (comm == "orted" || comm == "prted") return false;
    if (comm == "mpirun" || comm == "mpiexec" || comm == "orterun" || comm == "prterun") {
      char target[256] = {};
      const std::string fd = "/proc/" + std::to_string(pid) + "/fd/1";
      if (readlink(fd.c_str(), target, sizeof target - 1) <= 0) return false;
      const std::string t = target;
      return t.rfind("/dev/pts/", 0) == 0 || t.rfind("/dev/tty", 0) == 0;
    }
  }
  return false;
}

void Progress::start_epoch(int64_t epoch, int64_t first_step) {
  epoch_ = epoch;
  first_step_ = first_step;
  t0_ = Clock::now();
  drawn_ = false;
}

bool Progress::due(int64_t step) const {
  if (step % every_ != 0 && step != steps_) return false;
  if (!live_) return step != steps_;  // the epoch line follows at once
  // A redraw at most every 0.1 s, except the first.
  return !drawn_ || Clock::now() - last_draw_ >= std::chrono::milliseconds(100);
}

void Progress::show(int64_t step, double mean_loss) {
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - t0_).count();
  const int64_t done = step - first_step_;
  const double rate = elapsed > 0 ? double(done) * global_batch_ / elapsed : 0.0;
  const double eta = done > 0 ? elapsed / double(done) * double(steps_ - step) : 0.0;
  char line[256];
  // "step", not "epoch", first: a line that starts with "epoch" is the
  // epoch's own, one per epoch (README, "Output").
  std::snprintf(line, sizeof line, "step %lld/%lld  epoch %lld/%d  loss %.4f  %.0f samples/s  elapsed %.1fs  eta %.1fs",
                static_cast<long long>(step), static_cast<long long>(steps_), static_cast<long long>(epoch_ + 1),
                epochs_, mean_loss, rate, elapsed, eta);
  if (live_)
    out_ << "\r\033[K" << line << std::flush;
  else
    out_ << line << "\n" << std::flush;
  drawn_ = true;
  last_draw_ = now;
}

}  // namespace ddp::train
