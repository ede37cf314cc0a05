// A run's curves: the per-epoch records `ddp_train --metrics-out FILE` writes.
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace ddp::plot {

struct EpochPoint {
  int epoch = 0;
  double train_loss = 0;
  double test_acc = 0;
  double train_acc = std::numeric_limits<double>::quiet_NaN();  // NaN where the record has none
};

struct Run {
  std::string label;  // the legend's name for it
  std::string path;
  std::vector<EpochPoint> points;  // by epoch, each epoch once
};

// A command-line run argument: "LABEL=PATH", or PATH alone (the label is then
// the file's name without its extension: "runs/np4.jsonl" -> "np4"). An
// argument that names an existing file is a path even when it holds '='.
struct RunArg {
  std::string label;
  std::string path;
};
RunArg parse_run_arg(const std::string& arg);

// Reads path's records (epoch, train_loss and test_acc required; train_acc as
// well when need_train_acc). A later record of an epoch replaces an earlier
// one: a run resumed from a checkpoint older than its last logged epoch logs
// that epoch again. Throws ddp::Error naming the file, and the line where one
// is at fault; a file without records is an error too.
Run read_metrics(const RunArg& arg, bool need_train_acc = false);

}  // namespace ddp::plot
