#include "ddp/train/run_paths.hpp"

#include <algorithm>
#include <filesystem>
#include <ostream>

#include "ddp/core/error.hpp"

namespace ddp::train {

namespace {

namespace fs = std::filesystem;

// A file the run will write at some point: its directory must exist and take
// a file, and the path must not be a directory.
void check_output_file(const char* flag, const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) DDP_FAIL(flag, " ", path, ": is a directory, not a file name");
  const fs::path parent = fs::path(path).parent_path();
  checkpoint::check_writable_dir(std::string(flag) + " " + path + ": its directory", parent.empty() ? "." : parent.string(),
                                 /*create=*/false);
}

}  // namespace

std::unique_ptr<checkpoint::DirLock> check_run_paths(const Config& cfg, const std::string& host, std::ostream& err) {
  if (!cfg.resume.empty() && cfg.resume != "auto") {
    std::error_code ec;
    const fs::file_status st = fs::status(cfg.resume, ec);
    if (!fs::exists(st)) DDP_FAIL("--resume ", cfg.resume, ": no such file");
    if (fs::is_directory(st))
      DDP_FAIL("--resume ", cfg.resume, ": is a directory, not a checkpoint file (to continue from the newest "
               "checkpoint in a directory: --checkpoint-dir DIR --resume auto)");
    if (!fs::is_regular_file(st)) DDP_FAIL("--resume ", cfg.resume, ": not a regular file");
  }
  if (!cfg.output_model.empty()) check_output_file("--output-model", cfg.output_model);
  if (!cfg.metrics_out.empty()) check_output_file("--metrics-out", cfg.metrics_out);
  // Every rank writes its own trace file beside this one (rank 0 checks the
  // directory for all of them: on other nodes it is the same path).
  if (!cfg.trace.empty()) check_output_file("--trace", cfg.trace);
  if (!cfg.tensorboard.empty())
    checkpoint::check_writable_dir("--tensorboard", cfg.tensorboard, /*create=*/true);
  if (cfg.checkpoint_dir.empty()) return nullptr;
  // The other ranks wait meanwhile in the preflight's collectives, bounded
  // by --preflight-timeout: the wait for an orphaned holder stays well inside it.
  const double wait_s = std::min(kOrphanWaitSec, cfg.preflight_timeout_sec / 2);
  return std::make_unique<checkpoint::DirLock>(cfg.checkpoint_dir, host, wait_s, [&](const std::string& what) {
    err << "ddp_train: " << what << std::endl;
  });
}

}  // namespace ddp::train
