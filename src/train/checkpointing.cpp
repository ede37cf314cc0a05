// Checkpointing (checkpointing.hpp).
#include "ddp/train/checkpointing.hpp"

#include <iostream>

#include "ddp/checkpoint/safetensors.hpp"  // write_safetensors: --output-model
#include "ddp/core/error.hpp"              // DDP_FAIL
#include "ddp/core/finite.hpp"             // first_non_finite: no diverged state is saved
#include "ddp/reducer/reducer.hpp"             // broadcast_from_rank0
#include "ddp/train/resume.hpp"            // checkpoint contents, resume point

namespace ddp::train {

namespace {

// Before a state is written anywhere: every parameter finite, else an error
// naming the first parameter that is not.
void check_finite(const nn::Graph& g, const TrainState& s, const std::string& what) {
  const size_t at = first_non_finite(s.model.params.data(), s.model.params.size());
  if (at == s.model.params.size()) return;
  for (const auto& p : g.params)
    if (at >= p.offset && at < p.offset + p.numel)
      DDP_FAIL("refusing to write ", what, ": parameter ", p.name, " holds a NaN or an infinity (element ",
               at - p.offset, "): training diverged");
  DDP_FAIL("refusing to write ", what, ": a parameter holds a NaN or an infinity: training diverged");
}

// Rank 0's buffers and counters (and parameters, when params) to every rank,
// in host memory.
void broadcast_state(comm::Communicator& comm, nn::ModelState& s, bool params) {
  if (params) broadcast_from_rank0(comm, s.params.data(), s.params.size(), "initial parameters");
  broadcast_from_rank0(comm, s.buffers.data(), s.buffers.size(), "buffers");
  if (!s.counters.empty()) comm.broadcast(s.counters.data(), s.counters.size() * sizeof(int64_t), 0, "counters");
}

}  // namespace

Checkpointing::Checkpointing(const World& world, const Config& cfg, Replica& replica)
    : world_(world), cfg_(cfg), replica_(replica) {}

checkpoint::RunState Checkpointing::start(const data::Dataset& train, const optim::LrSchedule& schedule,
                                          const optim::Options& optimizer, int64_t steps_per_epoch,
                                          std::ostream& out) {
  const nn::Graph& g = replica_.graph();
  checkpoint::RunState at;
  at.config = resume_config(cfg_, g, train, schedule);
  const auto resumable = [&](const std::string& path, const checkpoint::Checkpoint& c) {
    check_resumable(path, c, g, steps_per_epoch, cfg_.batch_size, optimizer);
  };
  if (const auto resumed = find_resume_point(replica_.comm(), cfg_, at.config, resumable, out, std::cerr)) {
    restore(resumed->checkpoint, g, optimizer, host_);
    const auto config = at.config;
    at = resumed->checkpoint.state;
    at.config = config;
  } else {
    // Replicas start identical: rank 0's parameters and buffers everywhere.
    host_.model = nn::init_state(g, cfg_.seed);
    broadcast_state(replica_.comm(), host_.model, /*params=*/true);
  }
  replica_.push(host_);
  at.world_size = world_.size;  // what this run's checkpoints say
  return at;
}

void Checkpointing::sync_buffers() {
  const nn::Graph& g = replica_.graph();
  if (g.num_buffers == 0 && g.counters.empty()) return;
  replica_.pull_buffers(host_.model);
  broadcast_state(replica_.comm(), host_.model, /*params=*/false);
  replica_.push_buffers(host_.model);
}

std::string Checkpointing::save(const checkpoint::RunState& at, Trace* trace) {
  sync_buffers();
  if (world_.rank != 0) return std::string();
  TraceScope span(trace, Trace::kStep, "checkpoint", "checkpoint write", {{"step", at.global_step}});
  const TrainState& s = pull(detail::concat("the checkpoint of global step ", at.global_step));
  return checkpoint::save_checkpoint(cfg_.checkpoint_dir, at, checkpoint_tensors(replica_.graph(), s),
                                     cfg_.keep_checkpoints);
}

void Checkpointing::write_model(const std::string& path, int epochs_done) {
  TrainState model_only;
  model_only.model = pull("--output-model " + path).model;
  checkpoint::write_safetensors(path, checkpoint_tensors(replica_.graph(), model_only),
                                {{"format", "ddp-model"},
                                 {"model", cfg_.model},
                                 {"epochs", std::to_string(epochs_done)},
                                 {"world_size", std::to_string(world_.size)},
                                 {"global_batch", std::to_string(cfg_.batch_size)},
                                 {"seed", std::to_string(cfg_.seed)}});
}

const TrainState& Checkpointing::pull(const std::string& what) {
  replica_.pull(host_);
  check_finite(replica_.graph(), host_, what);
  return host_;
}

}  // namespace ddp::train
