// Checkpoints: one safetensors file per checkpoint, named by global step,
// written by rank 0 only, read by rank 0 only and broadcast (docs/checkpoints.md).
//
// Note [checkpoint contents]: tensors are the model's parameters under their
// state-dict names ("conv1.weight") and the optimizer state under
// "optimizer.<state>.<name>"; __metadata__ holds the run state (RunState) and
// "payload_crc32", a CRC-32 of the tensor bytes and of every other metadata
// entry, so a flipped bit anywhere but in the JSON punctuation is caught.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddp/checkpoint/safetensors.hpp"

namespace ddp::checkpoint {

// Version 1 is the first; a reader refuses versions it does not know.
constexpr int kFormatVersion = 1;

// Where a run stands. A checkpoint taken after step s of epoch e says
// epoch = e, step_in_epoch = s; one taken at the end of epoch e says
// epoch = e + 1, step_in_epoch = 0.
struct RunState {
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
  int64_t global_step = 0;
  int64_t samples_consumed = 0;
  int world_size = 1;            // of the run that wrote it (resume may differ)
  // Sums over the part of the current epoch already trained, so the epoch's
  // line after a resume counts the whole epoch.
  double epoch_loss_sum = 0, epoch_correct = 0, epoch_samples = 0, epoch_train_sec = 0;
  // What must be the same to resume: model, fingerprint, global batch, seed,
  // dataset, optimizer settings, LR schedule position. Compared field by field.
  std::map<std::string, std::string> config;
};

struct Checkpoint {
  RunState state;
  SafetensorsFile file;  // tensors and raw metadata
};

// "ckpt-<global step, 10 digits>.safetensors": lexical order is step order.
std::string checkpoint_file_name(int64_t global_step);

// The file's bytes: header, metadata (format, version, run state, CRC), tensors.
// (version is a parameter so that tests can write a future version.)
std::string encode_checkpoint(const RunState& state, const std::vector<TensorView>& tensors,
                              int version = kFormatVersion);

// Parses and validates bytes read from `path` (named in every error): the
// safetensors structure, the format name, a known version, the CRC, the run
// state's fields. Throws ddp::Error "<path>: <problem>".
Checkpoint decode_checkpoint(const std::string& path, const std::string& bytes);

// Writes atomically into dir (created if missing), then deletes the oldest
// checkpoints beyond `keep`. Returns the path written.
std::string save_checkpoint(const std::string& dir, const RunState& state,
                            const std::vector<TensorView>& tensors, int keep);

// Checkpoint files in dir (regular files named by the pattern), newest
// first. Missing dir: none.
std::vector<std::string> list_checkpoints(const std::string& dir);

// The whole file, or a ddp::Error naming it.
std::string read_file_bytes(const std::string& path);

// Field by field: throws ddp::Error naming the first field whose checkpoint
// value differs from the current one, with both values.
void check_compatible(const std::string& path, const std::map<std::string, std::string>& saved,
                      const std::map<std::string, std::string>& current);

}  // namespace ddp::checkpoint
