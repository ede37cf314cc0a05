#include "run_process.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace ddp::test {

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddp_cli_XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

void remove_tree(const std::string& dir) { std::filesystem::remove_all(dir); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

namespace {

std::string command_line(int np, const std::string& args, const std::string& wrapper) {
  std::string cmd;
  // Open MPI refuses root unless told twice; tests run as root in CI.
  if (np > 0)
    cmd = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(DDP_MPIEXEC) + " -np " +
          std::to_string(np) + " --oversubscribe --bind-to none ";
  // The suite's runs are the CPU's wherever it runs (their expectations are
  // the CPU's: its bits, its messages); a test that means another device
  // says so (GpuTraining: --device cuda; Devices: --device auto).
  const bool device = args.find("--device") != std::string::npos;
  if (!wrapper.empty()) cmd += wrapper + " ";
  // DDP_TEST_GPU_KERNELS: the GPU runs' --gpu-kernels where a test names
  // none, so that the GPU tests can run again with `next` before it becomes
  // the default (scripts/gpu-check.sh's GPU_TEST_KERNELS).
  std::string kernels;
  const char* k = std::getenv("DDP_TEST_GPU_KERNELS");
  if (k && *k && args.find("--device cuda") != std::string::npos && args.find("--gpu-kernels") == std::string::npos)
    kernels = std::string(" --gpu-kernels ") + k;
  return cmd + DDP_TRAIN_BIN + (device ? " " : " --device cpu ") + args + kernels;
}

RunResult collect(int raw, const std::string& dir) {
  RunResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = read_text(dir + "/out");
  r.err = read_text(dir + "/err");
  return r;
}

}  // namespace

// Processes whose environment holds `entry` ("NAME=value").
int processes_with_env(const std::string& entry) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_text(e.path().string() + "/environ");
    for (size_t at = 0; at < env.size();) {
      const size_t end = std::min(env.find('\0', at), env.size());
      if (env.compare(at, end - at, entry) == 0) {
        ++n;
        break;
      }
      at = end + 1;
    }
  }
  return n;
}

RunResult run_ddp_train(int np, const std::string& args, const std::string& wrapper) {
  static int runs = 0;
  const std::string dir = make_temp_dir();
  const std::string tag = "DDP_TEST_RUN=" + std::to_string(::getpid()) + "." + std::to_string(++runs);
  const std::string cmd = "env " + tag + " " + command_line(np, args, wrapper) + " >" + dir + "/out 2>" + dir + "/err </dev/null";
  const auto t0 = std::chrono::steady_clock::now();
  const int raw = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RunResult r = collect(raw, dir);
  r.seconds = seconds;
  wait_until([&] { return processes_with_env(tag) == 0; }, 10);
  r.left = processes_with_env(tag);
  remove_tree(dir);
  return r;
}

BackgroundJob::BackgroundJob(int np, const std::string& args, const std::string& wrapper)
    : dir_(make_temp_dir()) {
  const std::string cmd =
      "exec " + command_line(np, args, wrapper) + " >" + dir_ + "/out 2>" + dir_ + "/err </dev/null";
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::setsid();
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
}

BackgroundJob::~BackgroundJob() {
  if (running()) kill_all();
  if (!reaped_) wait();
  remove_tree(dir_);
}

namespace {

// The live (not zombie) processes of session `sid`.
std::vector<long> session_processes(long sid) {
  std::vector<long> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(e.path().string() + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    // Fields after "pid (comm)": state ppid pgrp session ...
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    rest >> state >> ppid >> pgrp >> session;
    if (session == sid && state != "Z") out.push_back(std::stol(name));
  }
  return out;
}

}  // namespace

// mpirun puts each rank in a process group of its own, and ranks outlive a
// killed mpirun; they all stay in the session the job was started in.
void BackgroundJob::kill_all() {
  for (;;) {
    const auto pids = session_processes(pid_);
    for (long p : pids) ::kill(pid_t(p), SIGKILL);
    if (pids.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string BackgroundJob::err_so_far() const { return read_text(dir_ + "/err"); }

int BackgroundJob::alive() const { return int(session_processes(pid_).size()); }

int BackgroundJob::rank_pid(int rank) const {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (long p : session_processes(pid_)) {
    if (read_text("/proc/" + std::to_string(p) + "/comm").rfind("ddp_train", 0) != 0) continue;
    std::string env = read_text("/proc/" + std::to_string(p) + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    for (const auto& var : lines_of(env))
      if (var == want) return int(p);
  }
  return -1;
}

void BackgroundJob::signal_launcher(int sig) { ::kill(pid_, sig); }

bool BackgroundJob::running() {
  if (reaped_) return false;
  const int r = ::waitpid(pid_, &raw_status_, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

RunResult BackgroundJob::wait() {
  if (!reaped_) {
    ::waitpid(pid_, &raw_status_, 0);
    reaped_ = true;
  }
  // Ranks orphaned by a killed launcher must not outlive the test.
  kill_all();
  return collect(raw_status_, dir_);
}

bool wait_until(const std::function<bool()>& pred, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

}  // namespace ddp::test
