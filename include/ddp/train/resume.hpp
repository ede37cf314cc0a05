// Between the trainer and checkpoint files: what a checkpoint holds of the
// model and optimizer, what must match to resume, and finding, validating and
// broadcasting the checkpoint to resume from.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/nn/model.hpp"
#include "ddp/optim/sgd.hpp"
#include "ddp/train/config.hpp"

namespace ddp::train {

// The configuration a resumed run must share with its checkpoint, field by
// field (model, architecture fingerprint, global batch, seed, dataset,
// optimizer, LR schedule). World size, epochs, buckets may change.
std::map<std::string, std::string> resume_config(const Config& cfg, const nn::Model& model,
                                                 const data::Dataset& train);

// Parameters, then optimizer state (Note [checkpoint contents]).
std::vector<checkpoint::TensorView> checkpoint_tensors(const nn::Model& model, optim::Sgd& sgd);

// Copies a checkpoint's tensors into the model and optimizer. Throws naming
// the file and the tensor that is missing or has the wrong shape.
void restore(const std::string& path, const checkpoint::Checkpoint& ckpt, nn::Model& model, optim::Sgd& sgd);

struct Resumed {
  std::string path;
  checkpoint::Checkpoint checkpoint;
};

// --resume PATH: that file, or an error naming it. --resume auto: the newest
// checkpoint in cfg.checkpoint_dir that decodes and validates; each one
// skipped is named in a warning on `log`; none means a fresh start (nullopt),
// said in one line. Only rank 0 reads files; the chosen file's bytes are
// broadcast, so other ranks need no shared filesystem. Collective.
std::optional<Resumed> find_resume_point(comm::Communicator& comm, const Config& cfg,
                                         const std::map<std::string, std::string>& current,
                                         std::ostream& out, std::ostream& log);

}  // namespace ddp::train
