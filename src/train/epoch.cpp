// One epoch of the Trainer (trainer.hpp): its steps, the checkpoints taken
// between them, and its record.
#include "ddp/train/trainer.hpp"

#include <algorithm>
#include <string>

#include "ddp/core/error.hpp"        // detail::concat
#include "ddp/data/loader.hpp"       // Loader: prefetching batches
#include "ddp/train/divergence.hpp"  // check_step, check_epoch_loss
#include "ddp/train/usage.hpp"       // RankUsage: every rank's peak memory

namespace ddp::train {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Trainer::Epoch Trainer::start_epoch() const {
  Epoch e;
  e.index = position_.epoch;
  e.first_step = e.step = position_.step_in_epoch;
  if (e.first_step > 0) {
    if (world_.rank == 0) {
      e.sums.loss = position_.epoch_loss_sum;
      e.sums.correct = position_.epoch_correct;
      e.sums.samples = position_.epoch_samples;
    }
    e.resumed_sec = position_.epoch_train_sec;
  }
  return e;
}

bool Trainer::train_steps(Epoch& e) {
  data_.sampler.set_epoch(static_cast<uint64_t>(e.index));
  data::Loader loader(data_.data.train, data_.sampler.indices(), data_.per_rank, /*drop_last=*/true, e.first_step);
  e.t0 = Clock::now();
  report_->start_epoch(e.index, e.first_step);
  replica_->begin_epoch();
  data::Batch batch;
  for (;;) {
    if (trace_) {
      if (trace_->window_passed(position_.global_step + 1)) write_trace();  // not part of any step's time
      trace_->begin_step(position_.global_step + 1);
      if (trace_->active() && !device_trace_begun_) {
        device_trace_begun_ = true;
        replica_->begin_device_trace();
      }
    }
    const auto step_start = Clock::now();
    bool more;
    {
      TraceScope span(trace_.get(), Trace::kStep, "data", "data wait");
      more = loader.next(batch);
    }
    if (!more) return true;
    const double data_wait = seconds_since(step_start);
    const double lr = schedule_.at(position_.global_step);
    const StepHealth health = replica_->train_step(batch, lr);
    if (trace_)
      trace_->span(Trace::kStep, "step", detail::concat("step ", position_.global_step + 1), step_start, Clock::now(),
                   {{"step", position_.global_step + 1}, {"epoch", e.index + 1}});
    e.times.add(data_wait, replica_->step_times());
    run_steps_.add(data_wait, replica_->step_times());
    if (check_step(replica_->comm(), health, replica_->scaler(), e.index, e.step + 1, position_.global_step + 1))
      ++e.skipped_steps;
    ++e.step;
    ++position_.global_step;
    position_.samples_consumed += cfg_.batch_size;
    // Rank 0's own batch: its loss and accuracy need its sums now (on a GPU
    // that waits for rank 0's device, each step).
    if (report_->wants_step_scalars())
      report_->step_scalars(position_.global_step, take_sums(e), lr, data_wait, replica_->step_times());
    if (report_->progress_due(e.step)) {
      take_sums(e);  // rank 0's alone: on a GPU this waits for its device, no other rank
      report_->show_progress(e.step, e.this_run.loss / e.this_run.samples);
    }
    if (!checkpoint_in_epoch(e)) return false;
  }
}

// Every --checkpoint-every global steps, and where some rank was sent a
// signal, a checkpoint with the epoch's sums so far over all ranks; the
// epoch's last step leaves it to the epoch's end. Returns false when the run
// stops here, asked to by a signal.
bool Trainer::checkpoint_in_epoch(Epoch& e) {
  if (cfg_.checkpoint_dir.empty() || e.step == data_.steps) return true;
  const int sig = stop_requested();
  const bool due = cfg_.checkpoint_every > 0 && position_.global_step % cfg_.checkpoint_every == 0;
  if (!sig && !due) return true;
  comm::Communicator& comm = replica_->comm();
  settle_and_take_sums(e);  // a run that diverged at the last step saves nothing
  double part[3] = {e.sums.loss, e.sums.correct, e.sums.samples};
  comm.allreduce_doubles(part, 3, /*max=*/false, "checkpoint epoch sums");
  checkpoint::RunState at = position_;
  at.step_in_epoch = e.step;
  at.epoch_loss_sum = part[0];
  at.epoch_correct = part[1];
  at.epoch_samples = part[2];
  at.epoch_train_sec = e.resumed_sec + seconds_since(e.t0);
  const std::string path = checkpointing_->save(at, trace_.get());
  if (!sig) return true;
  write_trace();
  report_->stopped(sig, detail::concat(" at epoch ", e.index + 1, ", step ", e.step, "; checkpoint ", path),
                   /*clear_line=*/true);
  comm.barrier("stop after checkpoint");
  return false;
}

// The replica's sums since they were last taken, into the epoch's (on a GPU
// this waits for the device).
Sums Trainer::take_sums(Epoch& e) {
  const Sums s = replica_->take_sums();
  e.sums += s;
  e.this_run += s;
  return s;
}

void Trainer::settle_and_take_sums(Epoch& e) {
  if (check_step(replica_->comm(), replica_->settle(), replica_->scaler(), e.index, e.step, position_.global_step))
    ++e.skipped_steps;
  take_sums(e);
}

// The epoch's figures over all ranks, and its evaluation.
EpochRecord Trainer::finish_epoch(Epoch& e) {
  comm::Communicator& comm = replica_->comm();
  settle_and_take_sums(e);  // waits for the device: the epoch's time includes all its work
  double train_sec = seconds_since(e.t0);
  comm.allreduce_doubles(&train_sec, 1, /*max=*/true, "epoch time");
  double totals[4] = {e.sums.loss, e.sums.correct, e.sums.samples, e.sums.comm_wait};
  comm.allreduce_doubles(totals, 4, /*max=*/false, "training metrics");
  train_sec += e.resumed_sec;
  check_epoch_loss(totals[0], e.index);  // the totals are the same on every rank

  EpochRecord r;
  r.breakdown = e.times.reduce(comm, "step times");
  r.usage = gather_usage(comm, {rss_peak_mib(), replica_->device_usage()});
  const auto t1 = Clock::now();
  {
    TraceScope span(trace_.get(), Trace::kStep, "evaluation", "evaluation", {{"epoch", e.index + 1}});
    r.test_acc = test_accuracy();
  }
  r.eval_sec = seconds_since(t1);

  r.epoch = e.index + 1;
  r.epochs = cfg_.epochs;
  r.global_step = position_.global_step;
  r.train_loss = totals[0] / totals[2];
  r.train_acc = totals[1] / totals[2];
  r.epoch_sec = train_sec;
  r.samples_per_sec = totals[2] / train_sec;
  r.comm_wait_sec = totals[3] / world_.size;
  r.lr = schedule_.at(position_.global_step - 1);  // the epoch's last step's
  // This rank's own counts: the same on every rank.
  const int64_t steps = std::max<int64_t>(1, data_.steps - e.first_step);
  r.allreduces_per_step = e.sums.allreduces / double(steps);
  r.allreduce_bytes_per_step = e.sums.allreduce_bytes / double(steps);
  // Over the steps that took one: a step fp16's scaler skipped has none.
  if (cfg_.clip_grad_norm > 0)
    r.grad_norm = e.sums.grad_norm / double(std::max<int64_t>(1, steps - e.skipped_steps));
  if (const optim::GradScaler* s = replica_->scaler()) {
    r.loss_scale = double(s->scale());
    r.skipped_steps = e.skipped_steps;
  }
  if (cfg_.deterministic_shards > 0) r.redone_steps = int64_t(e.sums.redone_steps);
  return r;
}

}  // namespace ddp::train
