// The Trainer's set-up, its epochs' ends and the run's end (trainer.hpp);
// the epoch itself is epoch.cpp's.
#include "ddp/train/trainer.hpp"

#include <exception>
#include <ostream>

#include "ddp/core/error.hpp"              // detail::concat
#include "ddp/nn/graph.hpp"                // model_graph: the model, described once
#include "ddp/runtime/stop_signal.hpp"     // SIGTERM/SIGINT -> stop at a step boundary
#include "ddp/train/evaluation.hpp"        // evaluate: exact distributed accuracy
#include "ddp/train/optim_config.hpp"      // flags -> optimizer options, LR schedule
#include "ddp/train/startup_table.hpp"     // the start-up lines, the steps' agreement

namespace ddp::train {

int run(const World& world, const Config& cfg, std::ostream& out) {
  Trainer trainer(world, cfg, out);
  return trainer.run();
}

Trainer::EndWatch::~EndWatch() {
  if (watchdog && std::uncaught_exceptions() == 0) watchdog->stop();
  watchdog.reset();
}

Trainer::Trainer(const World& world, const Config& cfg, std::ostream& out)
    : world_(world),
      cfg_(cfg),
      dir_lock_(lock_run_paths(world, cfg)),  // before anything is read or trained
      host_comm_(open_host_comm(world, cfg)),
      data_(load_training_data(*host_comm_, world, cfg)) {
  const data::Dataset& train = data_.data.train;
  nn::Graph graph = nn::model_graph(cfg.model, {train.c, train.h, train.w}, train.classes);
  optimizer_ = optimizer_options(cfg);
  schedule_ = lr_schedule(cfg, int64_t(cfg.epochs) * data_.steps);
  place_ = place(*host_comm_, world, cfg);
  // From here on every collective is numbered, and a stalled one ends the
  // job with rank 0's report of who is missing (comm/watchdog.hpp).
  if (world.size > 1)
    watchdog_ = std::make_unique<comm::Watchdog>(world, comm::Watchdog::Options{collective_timeout(cfg)});
  replica_ = make_replica(world, cfg, place_, std::move(host_comm_), watchdog_.get(), std::move(graph), optimizer_);
  replica_->comm().set_timeout(collective_timeout(cfg));
  checkpointing_ = std::make_unique<Checkpointing>(world, cfg, *replica_);
  position_ = checkpointing_->start(train, schedule_, optimizer_, data_.steps, out);
  if (!cfg.checkpoint_dir.empty()) install_stop_handlers();
  startup_table(*replica_, world, cfg, schedule_, data_.sampler.num_samples(), data_.steps, out);
  start_trace();
  report_ = std::make_unique<Reporter>(world, cfg, data_.steps, /*append_metrics=*/position_.global_step > 0, out);
}

int Trainer::run() {
  while (position_.epoch < cfg_.epochs) {
    Epoch e = start_epoch();
    if (!train_steps(e)) return kExitStoppedBySignal;
    summary_.epochs.push_back(finish_epoch(e));
    report_->epoch(summary_.epochs.back());
    if (!end_epoch(e)) return kExitStoppedBySignal;
  }
  return finish();
}

// The position after epoch e, and its checkpoint. Returns false when the run
// stops there, asked to by a signal.
bool Trainer::end_epoch(const Epoch& e) {
  position_.epoch = e.index + 1;
  position_.step_in_epoch = 0;
  position_.epoch_loss_sum = position_.epoch_correct = position_.epoch_samples = position_.epoch_train_sec = 0;
  if (cfg_.checkpoint_dir.empty()) return true;
  checkpointing_->save(position_, trace_.get());
  const int sig = stop_requested();
  if (!sig || position_.epoch >= cfg_.epochs) return true;
  write_trace();
  report_->stopped(sig, detail::concat(" after epoch ", e.index + 1), /*clear_line=*/false);
  replica_->comm().barrier("stop after checkpoint");
  return false;
}

int Trainer::finish() {
  // A run resumed after its last epoch still reports where it stands.
  summary_.test_acc = summary_.epochs.empty() ? test_accuracy() : summary_.epochs.back().test_acc;
  write_trace();
  comm::Communicator& comm = replica_->comm();
  summary_.steps = run_steps_.reduce(comm, "the run's step times");
  if (world_.rank == 0 && !cfg_.output_model.empty()) checkpointing_->write_model(cfg_.output_model, cfg_.epochs);
  summary_.backend = comm.backend();
  summary_.device = place_.device;
  summary_.steps_per_epoch = data_.steps;
  summary_.global_step = position_.global_step;
  report_->summary(summary_);
  // Nobody leaves before rank 0 has written its files: a rank that exits
  // early would not hurt, but a job that reports success before the model is
  // on disk would.
  comm.barrier("end of training");
  return 0;
}

double Trainer::test_accuracy() {
  checkpointing_->sync_buffers();
  return evaluate(*replica_, world_, data_.data.test, data_.per_rank);
}

// Ranks get signals at different moments, so the flag is all-reduced at each
// boundary where a stop may happen: every rank stops at the same step.
int Trainer::stop_requested() {
  double sig = stop_signal();
  replica_->comm().allreduce_doubles(&sig, 1, /*max=*/true, "stop-signal agreement");
  return static_cast<int>(sig);
}

// --trace: every rank's clock starts at one moment, so their files line up.
void Trainer::start_trace() {
  if (cfg_.trace.empty()) return;
  replica_->comm().barrier("--trace: a common start of the ranks' clocks");
  trace_ = std::make_unique<Trace>(world_.rank, world_.host, cfg_.trace_first, cfg_.trace_last, Trace::Clock::now());
  replica_->set_trace(trace_.get());
}

void Trainer::write_trace() {
  if (!trace_ || trace_->written()) return;
  if (device_trace_begun_) replica_->end_device_trace(*trace_);
  trace_->write(trace_path_for_rank(cfg_.trace, world_.rank));
}

}  // namespace ddp::train
