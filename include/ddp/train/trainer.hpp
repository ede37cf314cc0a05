// ddp::train::run and the Trainer behind it: one rank's run. Every rank runs
// it alike, with the same config; rank 0 prints and writes files. Its parts,
// in the order a run takes them:
//
//   set-up (the constructor)  the checkpoint directory locked, the host's
//                             communicator and the preflight, the data and
//                             the device (setup.hpp), the replica there, the
//                             resume point (checkpointing.hpp), the start-up
//                             table (startup_table.hpp)
//   each epoch (epoch.cpp)    its steps: a batch, the replica's step, its
//                             health (divergence.hpp), the step's scalars and
//                             the progress line (reporter.hpp), a checkpoint
//                             every --checkpoint-every steps or on a signal;
//                             then its sums (sums.hpp) and times reduced over
//                             the ranks and the evaluation (evaluation.hpp),
//                             gathered in one EpochRecord (epoch_record.hpp)
//   each epoch's end          the record reported, a checkpoint
//   the end                   --output-model, the summary
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>

#include "ddp/checkpoint/checkpoint.hpp"  // RunState: where the run stands
#include "ddp/checkpoint/dir_lock.hpp"    // DirLock: one job per checkpoint directory
#include "ddp/comm/communicator.hpp"      // Communicator
#include "ddp/comm/watchdog.hpp"          // Watchdog: numbered collectives, the stall report
#include "ddp/core/trace.hpp"             // Trace: --trace's timeline
#include "ddp/optim/lr_schedule.hpp"      // LrSchedule
#include "ddp/optim/optimizer.hpp"        // Options
#include "ddp/runtime/world.hpp"          // World
#include "ddp/train/checkpointing.hpp"    // Checkpointing: the state saved and restored
#include "ddp/train/config.hpp"           // Config
#include "ddp/train/epoch_record.hpp"     // EpochRecord: an epoch's figures
#include "ddp/train/placement.hpp"        // Placement: this rank's device
#include "ddp/train/replica.hpp"          // Replica: the model on its device, the step
#include "ddp/train/reporter.hpp"         // Reporter: rank 0's lines and files
#include "ddp/train/setup.hpp"            // TrainingData
#include "ddp/train/step_stats.hpp"       // StepStats: the median step and its parts
#include "ddp/train/sums.hpp"             // Sums: an epoch's loss, counts, waits

namespace ddp::train {

// Trains per config; returns the process exit status (0, or
// kExitStoppedBySignal). Throws ddp::Error on any failure (main turns it into
// the error contract).
int run(const World& world, const Config& config, std::ostream& out);

class Trainer {
 public:
  // The set-up, through the start-up table. Collective.
  Trainer(const World& world, const Config& cfg, std::ostream& out);
  // The epochs from the resume point on, then the end. Collective.
  int run();

 private:
  using Clock = std::chrono::steady_clock;

  // This rank's account of the epoch being trained.
  struct Epoch {
    int64_t index = 0;       // 0-based
    int64_t first_step = 0;  // 0, or where a resumed epoch starts
    int64_t step = 0;        // steps done, first_step's included
    // The epoch's sums so far, this rank's part; a resumed epoch's earlier
    // part is counted once, by rank 0.
    Sums sums;
    Sums this_run;           // this run's part of them: the progress line's
    double resumed_sec = 0;  // the training time of a resumed epoch's earlier part
    Clock::time_point t0;
    StepStats times;
    int64_t skipped_steps = 0;  // by --precision fp16's loss scaler
  };

  // One epoch (epoch.cpp). The steps return false when the run stops by a
  // signal, after its checkpoint.
  Epoch start_epoch() const;
  bool train_steps(Epoch& e);
  bool checkpoint_in_epoch(Epoch& e);
  Sums take_sums(Epoch& e);
  // The last step's outcome first, where the loss scale decides on the
  // device (Note [loss scale on the device]): a run that diverged there ends
  // here, and a skip counts in e; then take_sums.
  void settle_and_take_sums(Epoch& e);
  EpochRecord finish_epoch(Epoch& e);

  // The position after epoch e and its checkpoint; false when the run stops
  // there by a signal.
  bool end_epoch(const Epoch& e);
  // --output-model and the summary; every rank leaves together.
  int finish();
  // Collective: the test accuracy, with rank 0's buffers on every rank.
  double test_accuracy();
  // Collective: the signal some rank was sent (0: none), the same on every
  // rank.
  int stop_requested();
  void start_trace();
  void write_trace();

  // Ends the watching before the replica goes: with every rank at the end
  // of training (each return of run follows a barrier), or at once when an
  // error leaves.
  struct EndWatch {
    std::unique_ptr<comm::Watchdog>& watchdog;
    ~EndWatch();
  };

  const World& world_;
  const Config& cfg_;
  // The set-up, in order; members go in the reverse order, so the checkpoint
  // directory stays locked for this job until the last.
  std::unique_ptr<checkpoint::DirLock> dir_lock_;
  std::unique_ptr<comm::Communicator> host_comm_;  // until the replica's backend takes it
  TrainingData data_;
  optim::Options optimizer_;
  optim::LrSchedule schedule_;
  Placement place_;
  std::unique_ptr<Checkpointing> checkpointing_;
  std::unique_ptr<comm::Watchdog> watchdog_;
  std::unique_ptr<Replica> replica_;
  EndWatch end_watch_{watchdog_};
  // Where the run stands: an epoch's end, or a resumed epoch's step, with
  // global_step and samples_consumed counted on by every step.
  checkpoint::RunState position_;
  std::unique_ptr<Trace> trace_;
  bool device_trace_begun_ = false;  // the window's first step began: the device is recorded
  std::unique_ptr<Reporter> report_;
  StepStats run_steps_;  // every step of this run, for the summary
  RunSummary summary_;
};

}  // namespace ddp::train
