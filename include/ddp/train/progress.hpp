// ddp::train::Progress: what rank 0 shows while an epoch runs. On a terminal
// one line redrawn in place (step / steps, running loss, samples/s, elapsed,
// ETA), which the epoch line then replaces; elsewhere (Slurm logs, pipes) a
// plain line every few steps and no control characters.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>

namespace ddp::train {

class Progress {
 public:
  // live: redraw in place (a terminal), at most 10 times a second, every
  // `every` steps (0: every step). Not live: a line every `every` steps
  // (0: four lines an epoch).
  Progress(std::ostream& out, bool live, int64_t every, int epochs, int64_t steps, int global_batch);

  void start_epoch(int64_t epoch, int64_t first_step);
  // Whether step (1-based, in the epoch) is one to show: the caller fetches
  // the running loss only then.
  bool due(int64_t step) const;
  // Shows step, with rank 0's mean loss over the epoch's steps so far.
  void show(int64_t step, double mean_loss);
  // What starts the epoch line: on a terminal, the live line cleared.
  const char* epoch_line_prefix() const { return live_ && drawn_ ? "\r\033[K" : ""; }

  // Whether this process's stdout reaches a terminal: under Open MPI,
  // whether mpirun's does (Note [whose terminal]).
  static bool stdout_is_terminal();

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& out_;
  const bool live_;
  const int64_t every_;
  const int epochs_;
  const int64_t steps_;
  const int global_batch_;
  int64_t epoch_ = 0, first_step_ = 0;
  Clock::time_point t0_, last_draw_;
  bool drawn_ = false;
};

}  // namespace ddp::train
