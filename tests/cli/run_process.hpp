// Runs ddp_train as a user would (plain or under mpiexec) and captures its
// exit status, stdout and stderr.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ddp::test {

struct RunResult {
  int status = -1;  // exit status of the command (mpiexec for np > 0)
  std::string out, err;
  double seconds = 0;  // wall time until the command returned
  int left = 0;        // its processes still alive 10 s after it returned
};

// np == 0 runs ddp_train as a plain process; np >= 1 under mpiexec -np np.
// Every process of the run carries a tag in its environment, so that what
// outlives the launcher is found and counted (RunResult::left). `wrapper`,
// where given, starts each rank (mpiexec -np N WRAPPER ddp_train ARGS), as
// launch/nccl-host-per-rank does; it must exec ddp_train.
RunResult run_ddp_train(int np, const std::string& args, const std::string& wrapper = "");

// A job started in the background in its own process group, so that the
// launcher and every rank can be signalled together, as a scheduler would.
class BackgroundJob {
 public:
  BackgroundJob(int np, const std::string& args, const std::string& wrapper = "");
  ~BackgroundJob();  // SIGKILLs the group if still running
  // SIGKILL to the whole process group (mpirun and all ranks).
  void kill_all();
  // A signal to the launcher alone (mpirun forwards it to the ranks).
  void signal_launcher(int sig);
  // Waits for the launcher to exit; returns the RunResult (status, output).
  RunResult wait();
  bool running();
  // The pid of the job's rank `rank` (Open MPI's OMPI_COMM_WORLD_RANK in its
  // environment), -1 while there is none; and how many of the job's
  // processes are alive (the launcher's session, zombies aside).
  int rank_pid(int rank) const;
  int alive() const;
  // What the job has written to stderr so far.
  std::string err_so_far() const;

 private:
  int pid_ = -1;
  bool reaped_ = false;
  int raw_status_ = 0;
  std::string dir_;
};

// Polls (every 20 ms, up to timeout_s) until pred() is true; false on timeout.
bool wait_until(const std::function<bool()>& pred, double timeout_s);

// A fresh temporary directory, removed by the caller (remove_tree).
std::string make_temp_dir();
void remove_tree(const std::string& dir);

std::string read_text(const std::string& path);
std::vector<std::string> lines_of(const std::string& text);

}  // namespace ddp::test
