// Between the trainer and checkpoint files: what a checkpoint holds of the
// model and optimizer, what must match to resume, and finding, validating and
// broadcasting the checkpoint to resume from.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/optim/lr_schedule.hpp"  // LrSchedule
#include "ddp/optim/optimizer.hpp"    // Options
#include "ddp/train/config.hpp"
#include "ddp/train/replica.hpp"  // TrainState

namespace ddp::train {

// The configuration a resumed run must share with its checkpoint, field by
// field (model, architecture fingerprint, global batch, seed, dataset,
// optimizer, LR schedule, whose batch statistics). World size, epochs,
// buckets may change.
std::map<std::string, std::string> resume_config(const Config& cfg, const nn::Graph& g,
                                                 const data::Dataset& train, const optim::LrSchedule& schedule);

// Parameters, buffers and counters under their state-dict names, then the
// optimizer's state (Note [checkpoint contents]).
std::vector<checkpoint::TensorView> checkpoint_tensors(const nn::Graph& g, const TrainState& s);

// Throws ddp::Error naming the file when the checkpoint cannot be this run's
// starting point: its position (Note [resume position]) for `steps` steps per
// epoch of `global_batch` samples, or a tensor the model needs that is missing
// or has the wrong shape or type, the optimizer's (opt) state included.
void check_resumable(const std::string& path, const checkpoint::Checkpoint& ckpt, const nn::Graph& g,
                     int64_t steps, int global_batch, const optim::Options& opt = {});

// The checkpoint's tensors as a TrainState (check_resumable first), with
// the state of the optimizer opt describes.
void restore(const checkpoint::Checkpoint& ckpt, const nn::Graph& g, const optim::Options& opt, TrainState& s);

struct Resumed {
  std::string path;
  checkpoint::Checkpoint checkpoint;
};

// A check a checkpoint must pass to be resumed from (throws ddp::Error).
using ResumeCheck = std::function<void(const std::string& path, const checkpoint::Checkpoint&)>;

// --resume PATH: that file, or an error naming it. --resume auto: the newest
// checkpoint in cfg.checkpoint_dir that decodes, validates, has the current
// configuration and passes `usable`; each one skipped is named in a warning
// on `log`; none means a fresh start (nullopt), said in one line. Only rank 0
// reads files; the chosen file's bytes are broadcast, so other ranks need no
// shared filesystem. Collective.
std::optional<Resumed> find_resume_point(comm::Communicator& comm, const Config& cfg,
                                         const std::map<std::string, std::string>& current,
                                         const ResumeCheck& usable, std::ostream& out, std::ostream& log);

}  // namespace ddp::train
