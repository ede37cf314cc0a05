// Reporter (reporter.hpp).
#include "ddp/train/reporter.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::train {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

Reporter::Reporter(const World& world, const Config& cfg, int64_t steps_per_epoch, bool append_metrics,
                   std::ostream& out)
    : world_(world), cfg_(cfg), out_(out) {
  if (world.rank != 0) return;
  if (!cfg.metrics_out.empty()) {
    metrics_.open(cfg.metrics_out, append_metrics ? std::ios::app : std::ios::trunc);
    DDP_CHECK(metrics_, cfg.metrics_out, ": cannot open for writing (--metrics-out): ", std::strerror(errno));
  }
  // Every scalar at the global step it belongs to (an epoch's at its last
  // step), so per-step and per-epoch plots share one axis.
  if (!cfg.tensorboard.empty()) board_ = std::make_unique<observe::TensorBoardWriter>(cfg.tensorboard);
  if (!cfg.quiet)
    progress_ = std::make_unique<Progress>(out, &out == &std::cout && Progress::stdout_is_terminal(), cfg.log_every,
                                           cfg.epochs, steps_per_epoch, cfg.batch_size);
}

void Reporter::start_epoch(int64_t epoch, int64_t first_step) {
  if (progress_) progress_->start_epoch(epoch, first_step);
}

bool Reporter::progress_due(int64_t step) const { return progress_ && progress_->due(step); }

void Reporter::show_progress(int64_t step, double mean_loss) { progress_->show(step, mean_loss); }

void Reporter::step_scalars(int64_t at, const Sums& s, double lr, double data_wait, const StepTimes& t) {
  const double step_sec = data_wait + t.total();
  board_->scalar("step/loss", at, s.loss / s.samples);
  board_->scalar("step/accuracy", at, s.correct / s.samples);
  board_->scalar("step/lr", at, lr);
  board_->scalar("step/samples_per_sec", at, step_sec > 0 ? cfg_.batch_size / step_sec : 0);
  if (cfg_.clip_grad_norm > 0) board_->scalar("step/grad_norm", at, s.grad_norm);
  const double parts[StepBreakdown::kParts] = {data_wait + t.data, t.forward, t.backward, t.comm, t.optimizer};
  for (int i = 0; i < StepBreakdown::kParts; ++i)
    board_->scalar(std::string("step/time_ms/") + StepBreakdown::kNames[size_t(i)], at, parts[i] * 1e3);
}

void Reporter::epoch(const EpochRecord& r) {
  if (progress_) write_epoch_line(out_, progress_->epoch_line_prefix(), r);
  if (board_) write_epoch_scalars(*board_, r);
  if (metrics_.is_open()) metrics_ << epoch_json(r).dump() << "\n" << std::flush;
}

void Reporter::stopped(int sig, const std::string& where, bool clear_line) {
  if (world_.rank != 0) return;
  out_ << (clear_line && progress_ ? progress_->epoch_line_prefix() : "") << "ddp_train: stopped by signal " << sig
       << where << "; rerun with --resume auto to continue\n"
       << std::flush;
}

void Reporter::summary(const RunSummary& s) {
  if (world_.rank != 0) return;
  const EpochRecord last = s.epochs.empty() ? EpochRecord{} : s.epochs.back();
  std::vector<double> secs, rates;
  for (const EpochRecord& e : s.epochs) {
    secs.push_back(e.epoch_sec);
    rates.push_back(e.samples_per_sec);
  }
  nlohmann::ordered_json summary{{"event", "summary"},
                                 {"world_size", world_.size},
                                 {"epochs", cfg_.epochs},
                                 {"model", cfg_.model},
                                 {"global_batch", cfg_.batch_size},
                                 {"steps_per_epoch", s.steps_per_epoch},
                                 {"global_step", s.global_step},
                                 {"backend", s.backend},
                                 {"device", s.device},
                                 {"overlap", cfg_.overlap},
                                 {"optimizer", cfg_.optimizer},
                                 {"accumulate", cfg_.accumulate},
                                 {"grad_compression", cfg_.grad_compression},
                                 {"precision", cfg_.precision},
                                 {"allreduces_per_step", last.allreduces_per_step},
                                 {"allreduce_bytes_per_step", last.allreduce_bytes_per_step},
                                 {"test_acc", s.test_acc},
                                 {"train_acc", last.train_acc},
                                 {"train_loss", last.train_loss},
                                 {"epoch_sec_median", median(secs)},
                                 {"samples_per_sec", median(rates)}};
  if (!s.steps.empty) s.steps.add_to(summary);
  out_ << summary.dump() << std::endl;
}

}  // namespace ddp::train
