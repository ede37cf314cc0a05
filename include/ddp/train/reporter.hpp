// ddp::train::Reporter: everything rank 0 shows and writes while a run goes,
// behind one object: the progress line, each step's TensorBoard scalars,
// each epoch's record in its three forms (epoch_record.hpp), a stop by
// signal, and the summary line that ends the run. On other ranks it holds
// nothing and says nothing.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/observe/tensorboard.hpp"  // TensorBoardWriter: --tensorboard
#include "ddp/runtime/world.hpp"        // World
#include "ddp/train/config.hpp"         // Config
#include "ddp/train/epoch_record.hpp"   // EpochRecord and its writers
#include "ddp/train/progress.hpp"       // Progress: the live line or step lines
#include "ddp/train/replica.hpp"        // StepTimes
#include "ddp/train/step_stats.hpp"     // StepBreakdown
#include "ddp/train/sums.hpp"           // Sums

namespace ddp::train {

// What the summary says of a run beyond its flags.
struct RunSummary {
  std::string backend, device;  // as placed and chosen
  int64_t steps_per_epoch = 0, global_step = 0;
  std::vector<EpochRecord> epochs;  // this run's, in order; none when it resumed after its last epoch
  double test_acc = 0;              // the last evaluation's
  StepBreakdown steps;              // every step of this run
};

class Reporter {
 public:
  // Rank 0 opens --metrics-out (appending where the run resumes a run that
  // wrote it: the file then holds every epoch once) and --tensorboard (a
  // resumed run adds a file beside the first). Throws ddp::Error naming a
  // file it cannot open.
  Reporter(const World& world, const Config& cfg, int64_t steps_per_epoch, bool append_metrics, std::ostream& out);

  // The progress line: a new epoch, whether step (1-based, in the epoch) is
  // to be shown (fetch the running loss only then), and showing it.
  void start_epoch(int64_t epoch, int64_t first_step);
  bool progress_due(int64_t step) const;
  void show_progress(int64_t step, double mean_loss);

  // --tensorboard's step/ scalars of global step `at` (1-based): `s` holds
  // that step alone, of rank 0's own batch.
  bool wants_step_scalars() const { return board_ != nullptr; }
  void step_scalars(int64_t at, const Sums& s, double lr, double data_wait, const StepTimes& t);

  // The epoch line (unless --quiet), TensorBoard's epoch/ scalars and the
  // --metrics-out line.
  void epoch(const EpochRecord& r);
  // "ddp_train: stopped by signal S<where>; rerun with --resume auto to
  // continue", clearing a live progress line first when clear_line.
  void stopped(int sig, const std::string& where, bool clear_line);
  // The last line: {"event":"summary", …} (DESIGN.md's contract).
  void summary(const RunSummary& s);

 private:
  const World& world_;
  const Config& cfg_;
  std::ostream& out_;
  std::ofstream metrics_;
  std::unique_ptr<observe::TensorBoardWriter> board_;
  std::unique_ptr<Progress> progress_;  // rank 0 without --quiet
};

}  // namespace ddp::train
