// What tests read from a finished run: the summary line and the model file.
#pragma once

#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "ddp/checkpoint/safetensors.hpp"
#include "run_process.hpp"

namespace ddp::test {

// CUDA devices this process sees (0 in a build without CUDA).
int visible_gpus();

// How a suite's runs reach their ranks: the CPU's over MPI, or NCCL ranks
// sharing this machine's one GPU, each its own host to NCCL
// (launch/nccl-host-per-rank). "cpu" or "nccl_on_one_gpu".
struct RanksOn {
  std::string name;
  std::string flags;    // appended to each run's flags
  std::string wrapper;  // starts each rank (run_ddp_train's wrapper)
  // Why this machine cannot run them; empty when it can.
  std::string unfit() const;
};
RanksOn ranks_on(const std::string& name);

// The pids nvidia-smi lists as holding GPU memory (compute processes);
// nullopt where nvidia-smi is not there or fails.
std::optional<std::set<int>> gpu_compute_pids();

// Lines of stderr that carry the error contract "ddp_train: error: ...".
int error_lines(const std::string& err);

// A run that failed as docs/errors.md promises: a non-zero exit within 30 s, one
// "ddp_train: error: ... (rank R)" line that contains `needle`, no summary,
// and no process of it left behind.
void expect_failure(const RunResult& r, const std::string& needle);

// The run's {"event":"summary"} line, parsed (null when there is none).
nlohmann::json summary_of(const RunResult& r);

// Every tensor of a in b with the same bits (floats and integers), and no
// other tensor in b.
void expect_bitwise_equal(const checkpoint::SafetensorsFile& a, const checkpoint::SafetensorsFile& b);

// The global step of the newest checkpoint in dir that decodes; -1: none.
int64_t newest_checkpoint_step(const std::string& dir);

// Max |a - b| over all tensors, relative to max |a|; a missing tensor or a
// shape mismatch is a test failure.
double max_rel_diff(const checkpoint::SafetensorsFile& a, const checkpoint::SafetensorsFile& b);

// `np` ranks run `args` (which set everything but the seed and the metrics
// file) for `epochs` epochs once per seed: the mean test accuracy of each
// run's last `last` epochs, over the seeds (one run's accuracy moves by a
// few hundredths from epoch to epoch); each run's summary goes to check.
// NaN, and a failure, when a run fails or records another number of epochs.
double last_epochs_accuracy(int np, const std::string& args, int epochs, int last, std::initializer_list<int> seeds,
                            const std::function<void(const nlohmann::json&)>& check);

// Max relative difference of the models two runs write (runs must succeed;
// 1.0 when one fails).
double models_differ(int np_a, const std::string& args_a, int np_b, const std::string& args_b);

// The floats a step of `model` on 1x28x28 images all-reduces: its
// parameters and the zeros between their slots (Note [flat layout]).
double allreduced_floats(const std::string& model);

}  // namespace ddp::test
