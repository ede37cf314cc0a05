// What rank 0 checks of the paths a run reads and writes before any data is
// read, so that a run never trains for an epoch (or all of them) to fail at
// its first save: the checkpoint directory (created, writable, locked for
// this job: Note [one job per checkpoint directory]), the directories of
// --output-model, --metrics-out and --trace (they must exist and take a
// file), --tensorboard's directory (created, writable), and a --resume file
// (a regular file).
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "ddp/checkpoint/dir_lock.hpp"
#include "ddp/train/config.hpp"

namespace ddp::train {

// How long rank 0 waits for the ranks of a job whose launcher is gone to
// release the checkpoint directory (Note [one job per checkpoint directory]).
constexpr double kOrphanWaitSec = 20;

// Throws ddp::Error naming the flag and the path. Returns the checkpoint
// directory's lock (nullptr without --checkpoint-dir); hold it until the end.
// A wait for an orphaned holder of the lock is said on err.
std::unique_ptr<checkpoint::DirLock> check_run_paths(const Config& cfg, const std::string& host, std::ostream& err);

}  // namespace ddp::train
