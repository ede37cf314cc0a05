#include "ddp/plot/metrics.hpp"

#include <filesystem>
#include <map>

#include "ddp/core/error.hpp"   // DDP_CHECK
#include "ddp/plot/jsonl.hpp"   // for_each_record, number_at

namespace ddp::plot {

RunArg parse_run_arg(const std::string& arg) {
  namespace fs = std::filesystem;
  const auto eq = arg.find('=');
  std::error_code ec;
  if (eq == std::string::npos || fs::is_regular_file(arg, ec)) {
    DDP_CHECK(!arg.empty(), "an empty metrics file name");
    return {fs::path(arg).stem().string(), arg};
  }
  RunArg r{arg.substr(0, eq), arg.substr(eq + 1)};
  DDP_CHECK(!r.label.empty(), "'", arg, "': the label before '=' is empty (LABEL=PATH)");
  DDP_CHECK(!r.path.empty(), "'", arg, "': no file after '=' (LABEL=PATH)");
  return r;
}

Run read_metrics(const RunArg& arg, bool need_train_acc) {
  std::map<int, EpochPoint> by_epoch;
  for_each_record(arg.path, [&](const Json& record, const Where& where) {
    EpochPoint p;
    p.epoch = positive_int_at(record, "epoch", where);
    p.train_loss = number_at(record, "train_loss", where);
    p.test_acc = number_at(record, "test_acc", where);
    // Drawn only on request, so only then a reason to refuse the file.
    if (need_train_acc) {
      p.train_acc = number_at(record, "train_acc", where);
    } else if (const auto it = record.find("train_acc"); it != record.end() && it->is_number()) {
      p.train_acc = it->get<double>();
    }
    by_epoch[p.epoch] = p;
  });
  DDP_CHECK(!by_epoch.empty(), arg.path, ": no records (is it a file of ddp_train --metrics-out?)");
  Run run{arg.label, arg.path, {}};
  for (const auto& [epoch, p] : by_epoch) run.points.push_back(p);
  return run;
}

}  // namespace ddp::plot
