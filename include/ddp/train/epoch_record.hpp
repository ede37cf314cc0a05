// ddp::train::EpochRecord: one epoch's figures, reduced over the ranks and
// gathered once, and the three places rank 0 writes them: the epoch line on
// stdout, TensorBoard's epoch/ scalars and a --metrics-out JSON line. Tests
// and scripts parse all three, so each writer's bytes are a contract.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <vector>

#include "ddp/observe/tensorboard.hpp"  // TensorBoardWriter
#include "ddp/train/step_stats.hpp"     // StepBreakdown: the median step and its parts
#include "ddp/train/usage.hpp"          // RankUsage: every rank's peak memory

namespace ddp::train {

struct EpochRecord {
  int64_t epoch = 0;        // 1-based
  int epochs = 0;           // in the run (--epochs)
  int64_t global_step = 0;  // after the epoch's last step: TensorBoard's axis
  double train_loss = 0, train_acc = 0, test_acc = 0;
  double epoch_sec = 0;        // training, slowest rank, evaluation excluded (a resumed epoch's first part included)
  double eval_sec = 0;         // rank 0's evaluation
  double samples_per_sec = 0;  // training samples over epoch_sec
  double comm_wait_sec = 0;    // the host's wait for the all-reduces, mean over ranks
  double lr = 0;               // the epoch's last step's
  double allreduces_per_step = 0, allreduce_bytes_per_step = 0;
  // --clip-grad-norm: the mean norm before clipping over the steps that took one.
  std::optional<double> grad_norm;
  // --precision fp16: the loss scale at the epoch's end and the steps its
  // scaler skipped.
  std::optional<double> loss_scale;
  int64_t skipped_steps = 0;
  // --deterministic: the steps computed again, their gradients having
  // outgrown their fixed-point exponents (the same on every rank).
  std::optional<int64_t> redone_steps;
  StepBreakdown breakdown;      // empty: no step was timed (a resumed epoch with none left)
  std::vector<RankUsage> usage;  // rank order
};

// "epoch 2/10  train_loss 0.5123  ...", then, where steps were timed, an
// indented line of the median step and what the ranks used (indented, so
// that lines starting "epoch " stay one per epoch). `prefix` starts the
// first line (Progress::epoch_line_prefix).
void write_epoch_line(std::ostream& out, const char* prefix, const EpochRecord& r);

// The epoch/ scalars at r.global_step, flushed.
void write_epoch_scalars(observe::TensorBoardWriter& board, const EpochRecord& r);

// The --metrics-out object: one line of the JSONL file.
nlohmann::ordered_json epoch_json(const EpochRecord& r);

}  // namespace ddp::train
