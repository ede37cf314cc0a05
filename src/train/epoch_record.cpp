// EpochRecord's writers (epoch_record.hpp).
#include "ddp/train/epoch_record.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace ddp::train {

void write_epoch_line(std::ostream& out, const char* prefix, const EpochRecord& r) {
  char line[256];
  std::snprintf(line, sizeof(line),
                "epoch %lld/%d  train_loss %.4f  train_acc %.4f  test_acc %.4f  time %.2fs  %.0f samples/s  "
                "comm_wait %.3fs  lr %.4g",
                static_cast<long long>(r.epoch), r.epochs, r.train_loss, r.train_acc, r.test_acc, r.epoch_sec,
                r.samples_per_sec, r.comm_wait_sec, r.lr);
  out << prefix << line;
  if (r.grad_norm) {
    std::snprintf(line, sizeof(line), "  grad_norm %.4g", *r.grad_norm);
    out << line;
  }
  if (r.loss_scale) {
    std::snprintf(line, sizeof(line), "  loss_scale %g (%lld skipped)", *r.loss_scale,
                  static_cast<long long>(r.skipped_steps));
    out << line;
  }
  out << "\n";
  if (!r.breakdown.empty) out << "  " << r.breakdown.describe() << "; " << describe_usage(r.usage) << "\n";
  out << std::flush;
}

void write_epoch_scalars(observe::TensorBoardWriter& board, const EpochRecord& r) {
  const int64_t at = r.global_step;
  board.scalar("epoch/train_loss", at, r.train_loss);
  board.scalar("epoch/train_acc", at, r.train_acc);
  board.scalar("epoch/test_acc", at, r.test_acc);
  board.scalar("epoch/samples_per_sec", at, r.samples_per_sec);
  board.scalar("epoch/lr", at, r.lr);
  board.scalar("epoch/epoch", at, double(r.epoch));
  if (r.grad_norm) board.scalar("epoch/grad_norm", at, *r.grad_norm);
  if (r.loss_scale) {
    board.scalar("epoch/loss_scale", at, *r.loss_scale);
    board.scalar("epoch/skipped_steps", at, double(r.skipped_steps));
  }
  if (r.redone_steps) board.scalar("epoch/redone_steps", at, double(*r.redone_steps));
  const StepBreakdown& b = r.breakdown;
  if (!b.empty) {
    board.scalar("epoch/step_ms", at, b.step * 1e3);
    for (int i = 0; i < StepBreakdown::kParts; ++i)
      board.scalar(std::string("epoch/time_ms/") + StepBreakdown::kNames[size_t(i)], at, b.parts[size_t(i)] * 1e3);
    board.scalar("epoch/comm_hidden_frac", at, b.hidden_frac);
  }
  double rss = 0;
  for (const RankUsage& u : r.usage) rss = std::max(rss, u.rss_peak_mib);
  board.scalar("epoch/peak_rss_mib_max", at, rss);
  board.flush();
}

nlohmann::ordered_json epoch_json(const EpochRecord& r) {
  using json = nlohmann::ordered_json;
  json record{{"epoch", r.epoch},
              {"train_loss", r.train_loss},
              {"train_acc", r.train_acc},
              {"test_acc", r.test_acc},
              {"epoch_sec", r.epoch_sec},
              {"eval_sec", r.eval_sec},
              {"samples_per_sec", r.samples_per_sec},
              {"comm_wait_sec", r.comm_wait_sec},
              {"lr", r.lr},
              {"allreduces_per_step", r.allreduces_per_step},
              {"allreduce_bytes_per_step", r.allreduce_bytes_per_step}};
  if (r.grad_norm) record["grad_norm"] = *r.grad_norm;
  if (r.loss_scale) {
    record["loss_scale"] = *r.loss_scale;
    record["skipped_steps"] = r.skipped_steps;
  }
  if (r.redone_steps) record["redone_steps"] = *r.redone_steps;
  if (!r.breakdown.empty) r.breakdown.add_to(record);
  json mem = json::array(), gpu_mem = json::array(), gpu_util = json::array();
  for (const RankUsage& u : r.usage) {
    mem.push_back(u.rss_peak_mib);
    if (u.device.mem_peak_mib >= 0) gpu_mem.push_back(u.device.mem_peak_mib);
    if (u.device.util_pct >= 0) gpu_util.push_back(u.device.util_pct);
  }
  record["peak_rss_mib"] = std::move(mem);
  if (gpu_mem.size() == r.usage.size()) record["gpu_mem_peak_mib"] = std::move(gpu_mem);
  if (gpu_util.size() == r.usage.size()) record["gpu_util_pct"] = std::move(gpu_util);
  return record;
}

}  // namespace ddp::train
